"""Feedback signals: pure functions of a round record.

Two kinds, both computed from a :class:`~draftwise.trace.RoundRecord` alone:

* **signals** (bandit feedback) map a record to one scalar *reward* of the played arm, higher is
  better. Policies name the one they learn from (``ucb:reward=bd``); a signal with a parameter is
  named ``name:key=value`` (``reward=blend:alpha=0.3``).
* **losses** (full-information feedback, HedgeSpec) map a record whose ``counterfactual`` is filled
  to one loss per arm in [0, 1], lower is better.

Formulas: ``shared/design/METHODS.md`` and the papers; each function cites its source.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from draftwise.errors import DraftwiseError
from draftwise.options import keyword_defaults, split_spec, typed_options
from draftwise.registry import Registry
from draftwise.trace import RoundRecord

Signal = Callable[[RoundRecord], float]
SIGNALS: Registry[Callable[..., float]] = Registry("feedback signal")

LossFn = Callable[[RoundRecord], np.ndarray]
LOSSES: Registry[Callable[..., np.ndarray]] = Registry("full-information loss")


# -- the maths (pure, on plain arrays) ----------------------------------------------------------
def expected_accept_length(gammas: np.ndarray) -> np.ndarray:
    """HedgeSpec Theorem 3: Σ_{k=1}^{K+1} k (1 − γ_k) Π_{j<k} γ_j with γ_{K+1} = 0.

    ``gammas`` is ``(..., K)``: conditional acceptance probabilities along a verified trajectory.
    The sum telescopes to 1 + Σ_{k=1}^{K} Π_{j≤k} γ_j, which is what is computed. The value lies in
    [1, K+1] and counts the bonus / correction token (plain decoding = 1).

    >>> float(expected_accept_length(np.array([1.0, 1.0, 0.0])))
    3.0
    >>> float(expected_accept_length(np.array([0.5, 0.5])))
    1.75
    """
    gammas = np.asarray(gammas, dtype=float)
    if gammas.shape[-1] == 0:
        return np.ones(gammas.shape[:-1])
    return 1.0 + np.cumprod(gammas, axis=-1).sum(axis=-1)


def length_loss(gammas: np.ndarray) -> np.ndarray:
    """HedgeSpec's length loss 1 − estimate / (K+1) for ``(..., K)`` acceptance probabilities."""
    gammas = np.asarray(gammas, dtype=float)
    return 1.0 - expected_accept_length(gammas) / (gammas.shape[-1] + 1)


def acceptance_loss(gammas: np.ndarray) -> np.ndarray:
    """HedgeSpec's acceptance-probability loss: mean of 1 − γ over the positions (last axis)."""
    gammas = np.asarray(gammas, dtype=float)
    if gammas.shape[-1] == 0:
        return np.zeros(gammas.shape[:-1])
    return 1.0 - gammas.mean(axis=-1)


# -- bandit signals: record -> reward of the played arm ----------------------------------------
@SIGNALS.register("be")
def block_efficiency(record: RoundRecord) -> float:
    """MetaSD's BE: accepted draft tokens / draft budget L (0 when nothing could be drafted)."""
    return record.accepted / record.max_draft if record.max_draft else 0.0


@SIGNALS.register("bd")
def block_divergence(record: RoundRecord) -> float:
    """MetaSD's BD (eq. 4): mean of 1 − TV(p, q) over the drafted positions."""
    probs = record.accept_probs
    return sum(probs) / len(probs) if probs else 0.0


@SIGNALS.register("length")
def accepted_length(record: RoundRecord) -> float:
    """BanditSpec's reward: tokens produced by the round, the bonus token counted (y ∈ [1, L+1])."""
    return float(record.emitted)


@SIGNALS.register("throughput")
def throughput(record: RoundRecord) -> float:
    """BanditSpec §6.2: tokens per second of the round (0 when the round was not timed)."""
    seconds = record.seconds
    return record.emitted / seconds if seconds > 0 else 0.0


@SIGNALS.register("blend")
def blend(record: RoundRecord, alpha: float = 0.5) -> float:
    """TapOut's r_blend = α·|Y|/γ_max + (1 − α)·|Y|/|X| (|Y| accepted, |X| drafted, γ_max = L)."""
    if not 0.0 <= alpha <= 1.0:
        raise DraftwiseError(f"blend: alpha must be in [0, 1], got {alpha}")
    length_part = record.accepted / record.max_draft if record.max_draft else 0.0
    rate_part = record.accepted / record.drafted if record.drafted else 0.0
    return alpha * length_part + (1.0 - alpha) * rate_part


@SIGNALS.register("expected_length")
def expected_length(record: RoundRecord) -> float:
    """Theorem 3's expected accepted length of the played drafter from its own accept_probs.

    A lower-variance stand-in for ``length`` (same mean when the probabilities are exact).
    """
    return float(expected_accept_length(np.asarray(record.accept_probs, dtype=float)))


def signal(name: str) -> Signal:
    """Look up a signal by ``name`` or ``name:key=value`` (one clear error listing valid names)."""
    return _signal_cached(name)


@functools.lru_cache(maxsize=64)
def _signal_cached(spec: str) -> Signal:
    base, raw = split_spec(spec)
    fn = SIGNALS.get(base)
    if not raw:
        return fn
    options = typed_options(f"signal {base!r}", raw, keyword_defaults(fn, skip=("record",)))
    bound = functools.partial(fn, **options)
    fn(_PROBE, **options)  # validate option values now, not in the middle of a generation
    return bound


_PROBE = RoundRecord(index=0, arm=0, arm_name="", max_draft=1, drafted=1, accepted=1, emitted=2, position=0)


# -- full-information losses: record -> one loss per arm (chunk-level game, HedgeSpec §B.3) ------
def counterfactual_matrix(record: RoundRecord) -> np.ndarray:
    """``record.counterfactual`` as an ``(arms, verified positions)`` array, with a clear error."""
    if record.counterfactual is None:
        raise DraftwiseError(
            "this policy needs full-information feedback: the round record has no counterfactual "
            "acceptance probabilities (the engine fills them for policies with full_information=True)"
        )
    return np.asarray(record.counterfactual, dtype=float)


@LOSSES.register("accept")
def chunk_acceptance_loss(record: RoundRecord) -> np.ndarray:
    """f_h[i] = (1/k_h) Σ_j (1 − γ_{h,j}[i]) over the k_h verified positions of the round."""
    return acceptance_loss(counterfactual_matrix(record))


@LOSSES.register("length")
def chunk_length_loss(record: RoundRecord) -> np.ndarray:
    """f_h[i] = 1 − AcceptLength_{h,k_h}[i] / (k_h + 1), censored at the k_h verified positions."""
    return length_loss(counterfactual_matrix(record))


@LOSSES.register("hybrid")
def chunk_hybrid_loss(record: RoundRecord, switch: int = 3) -> np.ndarray:
    """HedgeSpec §B.5 hybrid schedule: acceptance loss for rounds < ``switch``, then length loss."""
    if record.index < switch:
        return chunk_acceptance_loss(record)
    return chunk_length_loss(record)


def loss_function(name: str) -> LossFn:
    """Look up a full-information loss by ``name`` or ``name:key=value``."""
    base, raw = split_spec(name)
    fn = LOSSES.get(base)
    if not raw:
        return fn
    options = typed_options(f"loss {base!r}", raw, keyword_defaults(fn, skip=("record",)))
    return functools.partial(fn, **options)


def token_losses(gammas: np.ndarray, depth: int, kind: str) -> np.ndarray:
    """Token-level game losses (HedgeSpec §3.3) for every start position whose inputs are known.

    ``gammas`` is ``(arms, T)``: acceptance probabilities of every arm at the verified positions
    1..T of the response so far. Returns ``(n, arms)`` loss vectors f_1..f_n, where for
    ``kind="accept"`` f_t = 1 − γ_t (n = T) and for ``kind="length"``
    f_t = 1 − (1/(K+1)) Σ_{k=1}^{K+1} k (1 − γ_{t+k−1}) Π_{j<k} γ_{t+j−1}, which needs γ up to
    t + K − 1 (n = T − K + 1): the feedback is delayed by K − 1 positions.
    """
    gammas = np.asarray(gammas, dtype=float)
    if kind == "accept":
        return (1.0 - gammas).T
    if kind != "length":
        raise DraftwiseError(f"token loss kind must be 'accept' or 'length', got {kind!r}")
    n = gammas.shape[1] - depth + 1
    if n <= 0:
        return np.zeros((0, gammas.shape[0]))
    windows = np.lib.stride_tricks.sliding_window_view(gammas, depth, axis=1)  # (arms, n, K)
    return length_loss(windows).T



# -- priors: a per-token acceptance rate in a signal's units -----------------------------------
def expected_accepted(rate: float, draft_len: int) -> float:
    """E[accepted draft tokens] for i.i.d. acceptance ``rate`` and ``draft_len`` tokens: Σ_k a^k.

    >>> expected_accepted(0.5, 2)
    0.75
    """
    return sum(rate**k for k in range(1, draft_len + 1))


_FROM_RATE: dict[str, Callable[[float, int], float]] = {
    "bd": lambda a, L: a,
    "be": lambda a, L: expected_accepted(a, L) / L,
    "blend": lambda a, L: expected_accepted(a, L) / L,
    "length": lambda a, L: 1.0 + expected_accepted(a, L),
    "expected_length": lambda a, L: 1.0 + expected_accepted(a, L),
}


def reward_from_acceptance(rate: float, signal_spec: str, draft_len: int) -> float | None:
    """What a round with per-token acceptance ``rate`` is worth under a signal (None: no model)."""
    convert = _FROM_RATE.get(signal_spec.split(":", 1)[0])
    return None if convert is None or draft_len < 1 else convert(rate, draft_len)
