"""Variants of UCB: UCBSpec (BanditSpec), UCB-Tuned (TapOut), Discounted and Sliding-window UCB
(MetaSD Alg. 6 and 8, for non-stationary responses)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from draftwise.errors import DraftwiseError
from draftwise.policies.base import register_policy
from draftwise.policies.ucb import MeanRewardPolicy, argmax_random_tie, ucb_index
from draftwise.trace import RoundRecord


# -- UCBSpec ------------------------------------------------------------------------------------
def ucbspec_radius(pulls: np.ndarray, t: float, n_arms: int, max_draft: int, delta: float) -> np.ndarray:
    """BanditSpec Alg. 4: cr_i = (L/2)·sqrt((1+n_i)/n_i² · (1 + 2 log(K t² sqrt(1+n_i) / δ))).

    +inf for arms never pulled.

    >>> round(float(ucbspec_radius(np.array([1.0]), 1, 1, 2, 1.0)[0]), 6)  # sqrt(2·(1+2 log √2))
    1.840189
    """
    tried = pulls > 0
    safe = np.where(tried, pulls, 1.0)
    # log(K t² sqrt(1+n)/δ) = log(K t²/δ) + ½ log(1+n)
    log_term = 1.0 + 2.0 * (math.log(n_arms * max(t, 1.0) ** 2 / delta) + 0.5 * np.log1p(safe))
    radius = (max_draft / 2.0) * np.sqrt((1.0 + safe) * log_term) / safe
    return np.where(tried, radius, np.inf)


@register_policy("ucbspec")
class UCBSpecPolicy(MeanRewardPolicy):
    """BanditSpec's UCBSpec: round-robin for the first K rounds, then argmax μ̂_i + cr_i.

    The reward is the accepted length y ∈ [1, L+1]; L is ``max_draft`` or, when 0, the draft
    budget of the rounds seen. δ = 0.5 is the value BanditSpec's Theorem 4.3 proof takes.

    The radius scales with L/2, the sub-Gaussian constant of a reward in [1, L+1] (``scale=range``,
    the paper). Other rewards are not on that scale: a batch's throughput per row in plain steps
    is the mean of its rows' and varies far less. ``scale=std`` puts the rewards' pooled standard
    deviation within arms in L/2's place (two pseudo-observations at L/2 while there are few): the
    same radius, its constant measured instead of bounded (BanditSpec §6.2's preset uses it).

    ``gamma`` < 1 discounts the evidence every round played (D-UCB's device, MetaSD Alg. 6, on
    UCBSpec's index): counts, sums and the round count t shrink by γ before the round is added, so
    an arm left unplayed regains its radius and is tried again. A batch's best length moves within
    a run — an answer's first rounds rarely find a lookup match, its later ones often do — and
    without it a learner that settled on ``none`` early never re-tried drafting (side observations
    reach only *shorter* lengths). 1 (no discount) is the paper.
    """

    summary = "BanditSpec UCBSpec (Alg. 4): round-robin start, then mean length + confidence radius (δ)"
    learned: ClassVar[tuple[str, ...]] = ("squares", "max_draft")  # L grows with the draft budgets seen
    side_observations = True
    decayed: ClassVar[tuple[str, ...]] = ("pulls", "sums", "squares", "t")
    SCALE_PRIOR = 2.0  # pseudo-observations of a variance of (L/2)² in scale=std

    def __init__(
        self,
        arms: Sequence[str],
        rng: np.random.Generator,
        *,
        delta: float = 0.5,
        max_draft: int = 0,
        reward: str = "length",
        scale: str = "range",
        gamma: float = 1.0,
        **common: Any,
    ) -> None:
        if not 0.0 < gamma <= 1.0:
            raise DraftwiseError(f"ucbspec: gamma (the discount per round) must be in (0, 1], got {gamma}")
        if not 0.0 < delta < 1.0 + 1e-12:
            raise DraftwiseError(f"ucbspec: delta must be in (0, 1], got {delta}")
        if scale not in ("range", "std"):
            raise DraftwiseError(f"ucbspec: scale must be range (L/2, the paper) or std (measured), got {scale!r}")
        self.delta = delta
        self.scale = scale
        self.gamma = gamma
        self.max_draft = max_draft
        self.auto_draft = max_draft == 0  # L = the largest draft budget seen (arms may differ in L)
        super().__init__(arms, rng, reward=reward, **common)

    def select(self) -> int:
        pulls = self.pulls.tolist()
        untried = [i for i, n in enumerate(pulls) if n <= 0]
        if untried:  # round-robin start, in arm order
            return untried[0]
        # ucbspec_radius in plain Python (a handful of arms: see argmax_random_tie)
        scale = self.radius_scale()
        log_k_t = math.log(self.n_arms * max(self.t, 1.0) ** 2 / self.delta)
        index = [s / n + scale * math.sqrt((1.0 + n) * (1.0 + 2.0 * (log_k_t + 0.5 * math.log1p(n)))) / n
                 for s, n in zip(self.sums.tolist(), pulls)]
        return argmax_random_tie(index, self.rng)

    def radius_scale(self) -> float:
        """L/2 (``scale=range``), or the rewards' pooled standard deviation within arms (``std``)."""
        bound = max(self.max_draft, 1) / 2.0
        if self.scale == "range":
            return bound
        within = sum(max(q - s * s / n, 0.0) for q, s, n in zip(self.squares, self.sums, self.pulls) if n > 0)
        count = float(self.pulls.sum())
        return math.sqrt((within + self.SCALE_PRIOR * bound**2) / (count + self.SCALE_PRIOR))

    def reset(self) -> None:
        super().reset()
        self.squares = np.zeros(self.n_arms)

    def warm_start(self, means: np.ndarray, weight: float) -> None:
        super().warm_start(means, weight)
        self.squares = weight * np.asarray(means, dtype=float) ** 2  # pseudo-pulls without spread

    def observe(self, arm: int, reward: float) -> None:
        if self.gamma < 1.0:
            self.decay_state(self.gamma)
        super().observe(arm, reward)
        self.squares[arm] += reward * reward

    def observe_side(self, arm: int, reward: float) -> None:
        super().observe_side(arm, reward)
        self.squares[arm] += reward * reward

    def update(self, arm: int, record: RoundRecord) -> float | None:
        if self.auto_draft:  # L is a property of the engine configuration, read off the rounds
            self.max_draft = max(self.max_draft, record.max_draft)
        return super().update(arm, record)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "delta": self.delta, "max_draft": self.max_draft, "scale": self.scale,
                "gamma": self.gamma}


# -- UCB-Tuned ----------------------------------------------------------------------------------
def ucb_tuned_index(mean: np.ndarray, var: np.ndarray, pulls: np.ndarray, t: float) -> np.ndarray:
    """TapOut §3.3: μ̂ + sqrt(ln t / n · min(1/4, σ̂² + sqrt(2 ln t / n))); untried arms +inf."""
    log_t = math.log(max(t, 1.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        v = var + np.sqrt(2.0 * log_t / pulls)
        index = mean + np.sqrt(log_t / pulls * np.minimum(0.25, v))
    return np.where(pulls > 0, index, np.inf)


@register_policy("ucb-tuned")
class UCBTunedPolicy(MeanRewardPolicy):
    """UCB-Tuned (Auer et al. 2002) as in TapOut: variance-aware bonus, rewards in [0, 1]."""

    summary = "UCB-Tuned (TapOut): variance-aware UCB on the blend reward"
    learned: ClassVar[tuple[str, ...]] = ("squares",)
    decayed: ClassVar[tuple[str, ...]] = ("pulls", "sums", "squares", "t")

    def __init__(self, arms: Sequence[str], rng: np.random.Generator, *, reward: str = "blend", **common: Any) -> None:
        super().__init__(arms, rng, reward=reward, **common)

    def reset(self) -> None:
        super().reset()
        self.squares = np.zeros(self.n_arms)

    def warm_start(self, means: np.ndarray, weight: float) -> None:
        super().warm_start(means, weight)
        self.squares = weight * np.asarray(means, dtype=float) ** 2

    def observe(self, arm: int, reward: float) -> None:
        super().observe(arm, reward)
        self.squares[arm] += reward * reward

    def select(self) -> int:
        untried = np.flatnonzero(self.pulls <= 0)
        if len(untried):
            return int(untried[0]) if len(untried) == 1 else int(self.rng.choice(untried))
        mean = self.sums / self.pulls
        var = np.maximum(self.squares / self.pulls - mean * mean, 0.0)
        return argmax_random_tie(ucb_tuned_index(mean, var, self.pulls, self.t), self.rng)


# -- Discounted UCB -----------------------------------------------------------------------------
@register_policy("ducb")
class DiscountedUCBPolicy(MeanRewardPolicy):
    """Discounted UCB (MetaSD Alg. 6; Kocsis & Szepesvári 2006, Garivier & Moulines 2011).

    Every round all counts and sums are multiplied by γ before the played arm's reward is added,
    so μ̂_i = Σ_s γ^{t−s} r_s 1[a_s=i] / Σ_s γ^{t−s} 1[a_s=i] and the bonus uses the discounted
    counts: β·sqrt(2 ln n_t / N_i) with n_t = Σ_i N_i. Note: MetaSD's Alg. 6 line 9 divides the
    discounted sum by the *undiscounted* count n_i, which drives the mean of a long-played arm to
    0; we follow the cited D-UCB (discounted counts) instead. γ is not given in MetaSD; 0.95 keeps
    a memory of about 1/(1−γ) = 20 rounds.
    """

    summary = "Discounted UCB (MetaSD Alg. 6): discount γ (default 0.95), β 0.01, BD reward"

    def __init__(
        self, arms: Sequence[str], rng: np.random.Generator, *, beta: float = 0.01, gamma: float = 0.95, **common: Any
    ) -> None:
        if not 0.0 < gamma <= 1.0:
            raise DraftwiseError(f"ducb: gamma must be in (0, 1], got {gamma}")
        self.beta = beta
        self.gamma = gamma
        super().__init__(arms, rng, **common)

    def observe(self, arm: int, reward: float) -> None:
        self.pulls *= self.gamma
        self.sums *= self.gamma
        self.pulls[arm] += 1.0
        self.sums[arm] += reward
        self.t = float(self.pulls.sum())

    def select(self) -> int:
        return argmax_random_tie(ucb_index(self.means(), self.pulls, self.t, self.beta), self.rng)


# -- Sliding-window UCB -------------------------------------------------------------------------
@register_policy("swucb")
class SlidingWindowUCBPolicy(MeanRewardPolicy):
    """Sliding-window UCB (MetaSD Alg. 8; Garivier & Moulines 2011): statistics over the last τ rounds.

    An arm absent from the window gets +inf and is tried again. ``ln t`` uses min(t, τ) as in
    Garivier & Moulines. τ is not given in MetaSD; 64 rounds is the default. A warm-start prior
    adds pseudo-observations outside the window: they never slide out, so keep its weight small.
    """

    summary = "Sliding-window UCB (MetaSD Alg. 8): window τ (default 64 rounds), β 0.01, BD reward"
    learned: ClassVar[tuple[str, ...]] = ("history",)

    def __init__(
        self, arms: Sequence[str], rng: np.random.Generator, *, beta: float = 0.01, window: int = 64, **common: Any
    ) -> None:
        if window < 1:
            raise DraftwiseError(f"swucb: window must be >= 1, got {window}")
        self.beta = beta
        self.window = window
        super().__init__(arms, rng, **common)

    def reset(self) -> None:
        super().reset()
        self.history: deque[tuple[int, float]] = deque()

    def state_examples(self) -> dict[str, list[Any]]:
        return {"history": [deque([(0, 0.0)])]}

    def check_state(self) -> None:
        super().check_state()
        if any(not 0 <= arm < self.n_arms for arm, _ in self.history):
            raise ValueError(f"swucb: the window names arms outside 0..{self.n_arms - 1}")

    def decay_state(self, factor: float) -> None:
        # The window already forgets; keeping across queries keeps the window as it is.
        pass

    def observe(self, arm: int, reward: float) -> None:
        self.history.append((arm, reward))
        self.pulls[arm] += 1
        self.sums[arm] += reward
        if len(self.history) > self.window:
            old_arm, old_reward = self.history.popleft()
            self.pulls[old_arm] -= 1
            self.sums[old_arm] -= old_reward
        self.t += 1

    def select(self) -> int:
        horizon = min(self.t, float(self.window))
        return argmax_random_tie(ucb_index(self.means(), self.pulls, horizon, self.beta), self.rng)
