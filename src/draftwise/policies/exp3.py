"""Adversarial bandits: EXP3 (MetaSD Alg. 7) and EXP3Spec (BanditSpec Alg. 5).

Both sample the arm from a distribution and learn from an importance-weighted estimate that is
unbiased for every arm, played or not. Weights are kept in log space: over a long response the
exponentiated sums overflow a float.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from draftwise.errors import DraftwiseError
from draftwise.policies.base import Policy, register_policy
from draftwise.trace import RoundRecord


def softmax(log_weights: np.ndarray) -> np.ndarray:
    """Normalised exp(log_weights), shifted by the max so nothing overflows."""
    z = np.exp(log_weights - log_weights.max())
    return z / z.sum()


def exp3_probs(log_weights: np.ndarray, gamma: float) -> np.ndarray:
    """MetaSD Alg. 7 line 3: p_i = (1 − γ)·w_i/Σw + γ/K.

    >>> exp3_probs(np.zeros(4), 0.4).tolist()
    [0.25, 0.25, 0.25, 0.25]
    """
    return (1.0 - gamma) * softmax(log_weights) + gamma / len(log_weights)


def importance_weighted(value: float, arm: int, probs: np.ndarray) -> np.ndarray:
    """The estimator x̂_j = 1[j = arm]·value/p_j: E over arm ~ p of x̂_j equals the value of arm j."""
    estimate = np.zeros(len(probs))
    estimate[arm] = value / probs[arm]
    return estimate


def exp3spec_eta(t: int, n_arms: int) -> float:
    """BanditSpec Alg. 5: the anytime learning rate η_t = sqrt(log K / (t·K))."""
    return math.sqrt(math.log(n_arms) / (max(t, 1) * n_arms))


def exp3spec_loss(y: float, max_draft: int) -> float:
    """BanditSpec eq. (6) before importance weighting: (L + 1 − y)/L ∈ [0, 1] for y ∈ [1, L+1]."""
    return (max_draft + 1 - y) / max_draft


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw an index from ``probs`` with one uniform from ``rng``."""
    u = rng.random()
    index = int(np.searchsorted(np.cumsum(probs), u * probs.sum(), side="right"))
    return min(index, len(probs) - 1)


@register_policy("exp3")
class EXP3Policy(Policy):
    """MetaSD-EXP3 (Alg. 7; Auer et al. 2002): γ-mixed exponential weights, γ = 0.4 (MetaSD §F.4).

    Rewards must lie in [0, 1] (BD or BE). A warm-start prior sets log w_i = γ·weight·μ_i.
    """

    summary = "MetaSD-EXP3 (Alg. 7): exponential weights mixed with γ = 0.4 uniform, BD reward"
    decayed: ClassVar[tuple[str, ...]] = ("log_weights",)
    learned: ClassVar[tuple[str, ...]] = ("log_weights", "t")

    def __init__(self, arms: Sequence[str], rng: np.random.Generator, *, gamma: float = 0.4, **common: Any) -> None:
        if not 0.0 < gamma <= 1.0:
            raise DraftwiseError(f"exp3: gamma must be in (0, 1], got {gamma}")
        self.gamma = gamma
        super().__init__(arms, rng, **common)

    def reset(self) -> None:
        self.log_weights = np.zeros(self.n_arms)
        self.t = 0

    def warm_start(self, means: np.ndarray, weight: float) -> None:
        self.log_weights = self.gamma * weight * np.asarray(means, dtype=float)

    def probs(self) -> np.ndarray:
        return exp3_probs(self.log_weights, self.gamma)

    def select(self) -> int:
        return sample(self.probs(), self.rng)

    def observe(self, arm: int, reward: float) -> None:
        # w_j ← w_j·exp(γ r̂_j / K), only the played arm's estimate is non-zero.
        p = self.probs()
        self.log_weights += self.gamma * importance_weighted(reward, arm, p) / self.n_arms
        self.t += 1

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "gamma": self.gamma, "t": self.t, "probs": self.probs().tolist()}


@register_policy("exp3spec")
class EXP3SpecPolicy(Policy):
    """BanditSpec's EXP3Spec (Alg. 5): p_t ∝ exp(−η_t Σ_s Ẑ_s), Ẑ_i = 1[i = I_t](L+1−y)/(L p_{t,i}).

    The reward is the accepted length y; L is ``max_draft`` or, when 0, the rounds' draft budget.
    A warm-start prior (in units of y) starts the cumulative losses at weight·(L+1−μ_i)/L.
    """

    summary = "BanditSpec EXP3Spec (Alg. 5): anytime η_t = sqrt(log K/(tK)), importance-weighted length loss"
    decayed: ClassVar[tuple[str, ...]] = ("cum_loss",)
    learned: ClassVar[tuple[str, ...]] = ("cum_loss", "t", "max_draft")

    def __init__(
        self,
        arms: Sequence[str],
        rng: np.random.Generator,
        *,
        max_draft: int = 0,
        reward: str = "length",
        **common: Any,
    ) -> None:
        self.max_draft = max_draft
        self.auto_draft = max_draft == 0  # L = the largest draft budget seen (arms may differ in L)
        super().__init__(arms, rng, reward=reward, **common)

    def reset(self) -> None:
        self.cum_loss = np.zeros(self.n_arms)
        self.t = 0

    def warm_start(self, means: np.ndarray, weight: float) -> None:
        L = max(self.max_draft, 1)
        self.cum_loss = weight * (L + 1 - np.asarray(means, dtype=float)) / L

    def probs(self) -> np.ndarray:
        return softmax(-exp3spec_eta(self.t + 1, self.n_arms) * self.cum_loss)

    def select(self) -> int:
        return sample(self.probs(), self.rng)

    def update(self, arm: int, record: RoundRecord) -> float | None:
        if self.auto_draft:  # L is a property of the engine configuration, read off the rounds
            self.max_draft = max(self.max_draft, record.max_draft)
        return super().update(arm, record)

    def observe(self, arm: int, reward: float) -> None:
        if self.max_draft < 1:
            raise DraftwiseError("exp3spec needs the draft budget L > 0 (set max_draft=L)")
        p = self.probs()  # the distribution the arm was drawn from (same t, same losses)
        self.cum_loss += importance_weighted(exp3spec_loss(reward, self.max_draft), arm, p)
        self.t += 1

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "t": self.t, "max_draft": self.max_draft, "probs": self.probs().tolist()}
