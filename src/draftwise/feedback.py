"""Feedback signals: pure functions of a round record (higher reward = better round).

Each signal maps a :class:`~draftwise.trace.RoundRecord` to a scalar reward. Bandit policies
name the signal they learn from (``ucb:reward=bd``). Formulas: ``shared/design/METHODS.md``.
"""

from __future__ import annotations

from typing import Callable

from draftwise.registry import Registry
from draftwise.trace import RoundRecord

Signal = Callable[[RoundRecord], float]
SIGNALS: Registry[Signal] = Registry("feedback signal")


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


def signal(name: str) -> Signal:
    """Look up a signal by name (one clear error listing the valid names)."""
    return SIGNALS.get(name)
