"""UCB1 with an exploration weight β (MetaSD-UCB, MetaSD Alg. 2)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from draftwise.policies.base import Policy, register_policy


def ucb_index(mean: np.ndarray, pulls: np.ndarray, t: int, beta: float) -> np.ndarray:
    """μ̂_i + β·sqrt(2 ln t / n_i); arms never pulled get +inf so each is tried once first.

    >>> ucb_index(np.array([0.5, 0.4]), np.array([1, 1]), 2, 0.0).tolist()
    [0.5, 0.4]
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        bonus = beta * np.sqrt(2.0 * math.log(max(t, 1)) / pulls)
    return np.where(pulls > 0, mean + bonus, np.inf)


@register_policy("ucb")
class UCBPolicy(Policy):
    """MetaSD-UCB: pull each arm once, then argmax of mean reward + β·sqrt(2 ln t / n_i)."""

    summary = "MetaSD-UCB: UCB1 with exploration β (default 0.01) on the BD reward"

    def __init__(self, arms: Sequence[str], rng: np.random.Generator, *, beta: float = 0.01, reward: str = "bd") -> None:
        self.beta = beta
        super().__init__(arms, rng, reward=reward)

    def reset(self) -> None:
        self.pulls = np.zeros(self.n_arms, dtype=np.int64)
        self.sums = np.zeros(self.n_arms)
        self.t = 0

    def select(self) -> int:
        mean = np.divide(self.sums, self.pulls, out=np.zeros(self.n_arms), where=self.pulls > 0)
        index = ucb_index(mean, self.pulls, self.t, self.beta)
        best = np.flatnonzero(index == index.max())
        return int(best[0]) if len(best) == 1 else int(self.rng.choice(best))

    def observe(self, arm: int, reward: float) -> None:
        self.t += 1
        self.pulls[arm] += 1
        self.sums[arm] += reward

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "beta": self.beta, "t": self.t,
                "pulls": self.pulls.tolist(), "sums": self.sums.tolist()}
