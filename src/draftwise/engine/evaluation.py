"""The evaluation phase (full-information feedback, HedgeSpec): every arm scored on the verified tokens.

After a round, every drafter behind some arm is scored at each verified position: its acceptance
probability there. The target's distribution at those positions came with the round's
verification (its argmax, and its warped probabilities when sampling), so no extra target forward
is needed. A policy may defer and batch the phase (HedgeSpec's skipping updates): rounds wait in
the query's ``pending`` list and are delivered later, in order; model drafters then catch up on
all pending tokens in one short forward, drafters on one bank in one batched forward.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from draftwise.drafters import Drafter
from draftwise.drafters.base import SharedForwards
from draftwise.engine.query import PendingRound, QueryState
from draftwise.policies import Policy
from draftwise.trace import RoundRecord


def queue_round(drafters: Sequence[Drafter], query: QueryState, record: RoundRecord, before: int, new: list[int],
                logits: torch.Tensor, target_probs: torch.Tensor | None) -> None:
    """Keep a verified round for the evaluation phase; drafters note what they need now."""
    start = time.perf_counter()
    rows = len(new)
    verified_from = query.context[:before]
    notes = {i: drafters[i].note_verified(verified_from, new, query.dctx) for i in query.played if i is not None}
    # Under greedy decoding the verified tokens *are* the target's argmax at their positions.
    choice = list(new) if target_probs is None else logits[:rows].argmax(-1).tolist()
    query.pending.append(PendingRound(record, before, rows, choice,
                                      None if target_probs is None else target_probs[:rows], notes))
    query.pending_tokens += rows
    record.eval_s += time.perf_counter() - start


def deliver(drafters: Sequence[Drafter], policy: Policy, query: QueryState) -> tuple[float, float]:
    """Evaluate the pending rounds, then give each record to the policy in order.

    Returns the seconds spent evaluating and updating."""
    t0 = time.perf_counter()
    evaluate(drafters, query)
    t1 = time.perf_counter()
    for item in query.pending:
        item.record.reward = policy.update(item.record.arm, item.record)
    query.pending, query.pending_tokens = [], 0
    return t1 - t0, time.perf_counter() - t1


def evaluate(drafters: Sequence[Drafter], query: QueryState) -> None:
    """Fill ``counterfactual`` of every pending round: arm i's acceptance probability at each
    verified position; arms sharing a drafter share one computation."""
    pending = query.pending
    first, total = pending[0].start, query.pending_tokens
    choice = [c for p in pending for c in p.choice]  # the target's argmax, as Python ints
    probs = None if pending[0].probs is None else torch.cat([p.probs for p in pending if p.probs is not None])
    prefix = query.context[: first + total - 1]
    shared = SharedForwards()
    scores: dict[int | None, list[float]] = {None: [0.0] * total}
    for i in sorted(d for d in query.played if d is not None):
        notes = [p.notes[i] for p in pending]
        scores[i] = drafters[i].acceptance_along(prefix, notes, choice, probs, query.settings.sampling, shared)
    offset = 0
    for item in pending:
        item.record.counterfactual = [scores[d][offset : offset + item.rows] for d in query.arm_drafter]
        offset += item.rows
