"""What a vLLM step costs, and each request's share of it (pure maths, no vLLM).

A step verifies every scheduled request at once, so its measured time is shared. A linear model,
fitted online to the measured steps,

    T ≈ a + b·R + c·X     (R requests scheduled, X tokens beyond one per request: drafts, prefill)

splits it: request i's share is ``a/R + b + c·x_i`` (x_i: its draft tokens), and a plain step of
the same request at the same load would cost ``a/R + b``. The fixed part ``a`` is what makes
drafting nearly free at batch 1; ``c`` is what makes it expensive under load, where ``a/R`` is small.

Rewards are measured throughput: tokens emitted per second of the request's share of the
measured step (plus its own drafting time). With ``time_unit="plain-step"`` (the default) the
seconds are counted in units of the predicted plain step of that request at the current load, so
a round without speculation is worth ≈ 1 token per unit at any batch size and a learner's
statistics stay on one scale as the load moves (ranking arms within a load is unchanged). With
``time_unit="seconds"`` the record holds raw seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Prior guesses (seconds) for a small model on a CPU, each worth PRIOR_WEIGHT observations; the
# fit takes over after a few dozen steps.
PRIOR = (5e-3, 3e-4, 3e-4)
PRIOR_WEIGHT = 4.0
FORGET = 0.995  # per step: the fit follows a machine whose speed drifts (shared CPUs)
IDLE_FACTOR = 8.0  # a step this many times slower than predicted waited for work: not a cost sample
IDLE_MIN_S = 0.05


@dataclass
class StepShape:
    """What one step verified: requests scheduled, extra tokens in all, and the measured seconds."""

    requests: int
    extra_tokens: int
    seconds: float


class StepCostModel:
    """Ridge regression of step time on (1, R, X) with forgetting and a fixed prior."""

    def __init__(self, prior: tuple[float, float, float] = PRIOR, weight: float = PRIOR_WEIGHT,
                 forget: float = FORGET) -> None:
        self.prior_mean = np.asarray(prior, dtype=float)
        # Prior precision scaled to typical feature sizes (R ~ 8, X ~ 16), so each coefficient's
        # prior is worth ``weight`` typical steps.
        self.prior_prec = weight * np.diag([1.0, 64.0, 256.0])
        self.forget = forget
        self.gram = np.zeros((3, 3))
        self.moment = np.zeros(3)
        self.steps = 0
        self.coef = self.prior_mean.copy()

    def predict(self, requests: int, extra_tokens: int) -> float:
        a, b, c = self.coef
        return a + b * requests + c * extra_tokens

    def is_idle(self, shape: StepShape) -> bool:
        """A step far slower than predicted included waiting (an idle server), not work."""
        return shape.seconds > max(IDLE_MIN_S, IDLE_FACTOR * self.predict(shape.requests, shape.extra_tokens))

    def observe(self, shape: StepShape) -> bool:
        """Add one measured step; False (and no update) for an idle or empty one."""
        if shape.requests <= 0 or shape.seconds <= 0 or self.is_idle(shape):
            return False
        x = np.array([1.0, shape.requests, shape.extra_tokens])
        self.gram = self.forget * self.gram + np.outer(x, x)
        self.moment = self.forget * self.moment + x * shape.seconds
        self.steps += 1
        coef = np.linalg.solve(self.gram + self.prior_prec, self.moment + self.prior_prec @ self.prior_mean)
        self.coef = np.maximum(coef, [0.0, 1e-6, 1e-6])  # costs are never negative
        return True


def request_share(coef: np.ndarray, requests: int, extra: int) -> float:
    """Predicted seconds of one request's part of a step: a/R + b + c·extra."""
    a, b, c = (float(v) for v in coef)
    return a / max(requests, 1) + b + c * extra


@dataclass(frozen=True)
class RoundTimes:
    """One request's round in the unit chosen: verification share and its own drafting."""

    verify: float
    draft: float


def attribute(coef: np.ndarray, shape: StepShape, extra: int, draft_s: float, unit: str) -> RoundTimes:
    """Split the measured step over its requests by the model; express it in ``unit``.

    >>> coef = np.array([0.004, 0.0, 0.001])
    >>> t = attribute(coef, StepShape(requests=1, extra_tokens=4, seconds=0.008), 4, 0.0, "plain-step")
    >>> round(t.verify, 6)  # 4 draft tokens make the step 8/5 of a plain one
    1.6
    """
    a, b, c = (float(v) for v in coef)
    predicted = a + b * shape.requests + c * shape.extra_tokens
    share = request_share(coef, shape.requests, extra)
    verify_s = shape.seconds * share / predicted if predicted > 0 else shape.seconds / max(shape.requests, 1)
    if unit == "seconds":
        return RoundTimes(verify_s, draft_s)
    plain = request_share(coef, shape.requests, 0)
    return RoundTimes(verify_s / plain, draft_s / plain)


def batch_times(coef: np.ndarray, shape: StepShape, prefill_extra: int, decode_requests: int,
                draft_s: float, unit: str) -> RoundTimes:
    """The whole step for the batch-level learner: with ``plain-step``, in units of the predicted
    plain step per decoding request (so tokens per unit = tokens per request per plain step)."""
    if unit == "seconds":
        return RoundTimes(shape.seconds, draft_s)
    a, b, c = (float(v) for v in coef)
    plain = (a + b * shape.requests + c * prefill_extra) / max(decode_requests, 1)
    return RoundTimes(shape.seconds / plain, draft_s / plain)


def load_bucket(requests: int) -> int:
    """Batch-size bucket for contextual learners: 0 for 1 request, 1 for 2–3, … 5 for ≥ 32.

    >>> [load_bucket(n) for n in (1, 2, 4, 8, 16, 32, 64)]
    [0, 1, 2, 3, 4, 5, 5]
    """
    return min(5, int(math.log2(max(requests, 1))))
