"""Synthetic acceptance processes: the maths the scenarios and the simulator share (pure functions).

Model (stated in ``docs/simulator.md``): the target's response is a fixed trajectory of B tokens
(verification is lossless, so it does not depend on the drafter). At each position t every
drafter i has a conditional acceptance probability γ_t[i] — what the engine reports as
1 − TV(p, q_i) — drawn from Beta(κα, κ(1 − α)) with α = α[i, domain(t)], so its mean is the
drafter's per-token acceptance rate in that domain. A draft token at position t is accepted when
U_t < γ_t[i] for one uniform U_t per position, shared by all drafters and policies (common random
numbers). With independent positions the accepted length of a round is truncated-geometric with
E[y] = (1 − α^{L+1})/(1 − α), which is how published MATs are converted to α.
"""

from __future__ import annotations

import math

import numpy as np

from draftwise.errors import DraftwiseError


def mat_from_acceptance(alpha: float, chunk: int) -> float:
    """Expected tokens per round with per-token rate α and up to ``chunk`` = L+1 tokens per round.

    >>> mat_from_acceptance(0.5, 2)
    1.5
    """
    if alpha >= 1.0:
        return float(chunk)
    return (1.0 - alpha**chunk) / (1.0 - alpha)


def acceptance_from_mat(mat: float, chunk: int) -> float:
    """Solve m = (1 − α^{K+1})/(1 − α) for α ∈ [0, 1), K+1 = ``chunk`` (bisection to 1e-12).

    >>> round(acceptance_from_mat(1.5, 2), 9)
    0.5
    """
    if not 1.0 <= mat < chunk:
        raise DraftwiseError(f"a MAT of {mat} is impossible with {chunk} tokens per round (need 1 <= MAT < {chunk})")
    lo, hi = 0.0, 1.0
    for _ in range(60):  # the MAT is increasing in α
        mid = 0.5 * (lo + hi)
        if mat_from_acceptance(mid, chunk) < mat:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def draw_gammas(alpha: np.ndarray, kappa: float, rho: float, rng: np.random.Generator) -> np.ndarray:
    """Per-position acceptance probabilities, ``alpha`` is (positions, arms) of per-token means.

    γ ~ Beta(κα, κ(1−α)) independently per position and arm; with ``rho`` > 0 a position keeps the
    previous position's γ with probability ρ (Markov correlation: runs of easy or hard tokens; the
    marginal mean stays α but accepted lengths are no longer truncated-geometric).
    """
    a = np.clip(alpha, 1e-6, 1 - 1e-6)
    gammas = rng.beta(kappa * a, kappa * (1.0 - a))
    if rho > 0:
        fresh = rng.random(gammas.shape) >= rho
        fresh[0] = True
        # forward-fill: each position takes the γ of the last fresh position at or before it
        last = np.maximum.accumulate(np.where(fresh, np.arange(len(gammas))[:, None], 0), axis=0)
        gammas = np.take_along_axis(gammas, last, axis=0)
    return gammas


def response_lengths(
    n: int, median: float, sigma: float, cap: int, floor: int, rng: np.random.Generator
) -> np.ndarray:
    """Log-normal response lengths with the given median, clipped to [floor, cap] tokens."""
    return np.clip(np.round(rng.lognormal(math.log(median), sigma, size=n)), floor, cap).astype(int)


def next_failure(accepts: np.ndarray) -> np.ndarray:
    """For each position, the first position at or after it whose draft token would be rejected.

    ``accepts`` is (positions, arms) booleans; the result has the same shape, with ``positions``
    where no rejection follows.

    >>> next_failure(np.array([[True], [False], [True]])).ravel().tolist()
    [1, 1, 3]
    """
    n = len(accepts)
    index = np.where(~accepts, np.arange(n)[:, None], n)
    return np.minimum.accumulate(index[::-1], axis=0)[::-1]


def fixed_arm_rounds(failure: np.ndarray, tokens: int, max_draft: int) -> int:
    """Rounds a fixed drafter needs for ``tokens`` tokens, from its ``next_failure`` column.

    A round at position t accepts min(first failure − t, L) tokens and emits one more.
    """
    t, rounds = 0, 0
    while t < tokens:
        accepted = min(int(failure[t]) - t, max_draft)
        t += accepted + 1
        rounds += 1
    return rounds
