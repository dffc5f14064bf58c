"""ε-greedy, the simplest baseline learner."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from draftwise.errors import DraftwiseError
from draftwise.policies.base import register_policy
from draftwise.policies.ucb import MeanRewardPolicy, argmax_random_tie


@register_policy("egreedy")
class EpsilonGreedyPolicy(MeanRewardPolicy):
    """With probability ε a uniformly random arm, else the best mean (untried arms first)."""

    summary = "ε-greedy baseline (ε = 0.1): explore uniformly with probability ε, else best mean"

    def __init__(self, arms: Sequence[str], rng: np.random.Generator, *, epsilon: float = 0.1, **common: Any) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise DraftwiseError(f"egreedy: epsilon must be in [0, 1], got {epsilon}")
        self.epsilon = epsilon
        super().__init__(arms, rng, **common)

    def select(self) -> int:
        if self.rng.random() < self.epsilon:
            return int(self.rng.integers(self.n_arms))
        mean = np.where(self.pulls > 0, self.means(), np.inf)
        return argmax_random_tie(mean, self.rng)
