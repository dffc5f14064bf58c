"""Thompson sampling: Beta-Bernoulli and Gaussian (TapOut §3.3)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from draftwise.errors import DraftwiseError
from draftwise.policies.base import Policy, register_policy
from draftwise.policies.ucb import MeanRewardPolicy, argmax_random_tie


@register_policy("ts-beta")
class BetaThompsonPolicy(Policy):
    """Beta-Bernoulli Thompson sampling with a Beta(1, 1) prior per arm.

    Rewards in [0, 1]. With ``binarize`` (default) a reward r counts as one Bernoulli(r) trial
    (Agrawal & Goyal 2012), which keeps the posterior exact for fractional rewards such as BD;
    without it, the pseudo-counts grow by r and 1 − r.
    """

    summary = "Beta-Bernoulli Thompson sampling (TapOut token level), rewards in [0, 1]"
    decayed: ClassVar[tuple[str, ...]] = ("successes", "failures")  # decay shrinks towards Beta(1, 1)
    learned: ClassVar[tuple[str, ...]] = ("successes", "failures")

    def check_state(self) -> None:
        if (self.successes < 0).any() or (self.failures < 0).any():
            raise ValueError("ts-beta: negative success or failure counts")

    def __init__(self, arms: Sequence[str], rng: np.random.Generator, *, binarize: bool = True, **common: Any) -> None:
        self.binarize = binarize
        super().__init__(arms, rng, **common)

    def reset(self) -> None:
        self.successes = np.zeros(self.n_arms)
        self.failures = np.zeros(self.n_arms)

    def warm_start(self, means: np.ndarray, weight: float) -> None:
        means = np.clip(np.asarray(means, dtype=float), 0.0, 1.0)
        self.successes = weight * means
        self.failures = weight * (1.0 - means)

    def select(self) -> int:
        return argmax_random_tie(self.rng.beta(1.0 + self.successes, 1.0 + self.failures), self.rng)

    def observe(self, arm: int, reward: float) -> None:
        if not 0.0 <= reward <= 1.0:
            raise DraftwiseError(f"ts-beta needs rewards in [0, 1], got {reward} (use reward=bd, be or blend)")
        if self.binarize:
            reward = float(self.rng.random() < reward)
        self.successes[arm] += reward
        self.failures[arm] += 1.0 - reward

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "successes": self.successes.tolist(), "failures": self.failures.tolist()}


def gaussian_posterior(
    pulls: np.ndarray, sums: np.ndarray, prior_mean: float, prior_std: float, noise_std: float
) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and std of each arm's mean reward: normal prior, known noise variance.

    >>> m, s = gaussian_posterior(np.array([0.0]), np.array([0.0]), 0.5, 1.0, 0.1)
    >>> m.tolist(), s.tolist()
    ([0.5], [1.0])
    """
    precision = 1.0 / prior_std**2 + pulls / noise_std**2
    mean = (prior_mean / prior_std**2 + sums / noise_std**2) / precision
    return mean, 1.0 / np.sqrt(precision)


@register_policy("ts-gaussian")
class GaussianThompsonPolicy(MeanRewardPolicy):
    """Gaussian Thompson sampling (TapOut's sequence level): N(μ0, σ0²) prior, known noise σ.

    TapOut does not give the constants; the defaults suit rewards in [0, 1] (blend).
    """

    summary = "Gaussian Thompson sampling (TapOut sequence level) on the blend reward"

    def __init__(
        self,
        arms: Sequence[str],
        rng: np.random.Generator,
        *,
        prior_mean: float = 0.5,
        prior_std: float = 0.5,
        noise_std: float = 0.25,
        reward: str = "blend",
        **common: Any,
    ) -> None:
        if prior_std <= 0 or noise_std <= 0:
            raise DraftwiseError("ts-gaussian: prior_std and noise_std must be > 0")
        self.prior_mean = prior_mean
        self.prior_std = prior_std
        self.noise_std = noise_std
        super().__init__(arms, rng, reward=reward, **common)

    def select(self) -> int:
        mean, std = gaussian_posterior(self.pulls, self.sums, self.prior_mean, self.prior_std, self.noise_std)
        return argmax_random_tie(self.rng.normal(mean, std), self.rng)
