"""Per-request state inside the vLLM proposer, and which batch row is which request.

vLLM hands the proposer rows, not requests: rows are reordered as requests finish and arrive.
The proposer reads the request ids of the rows from the model runner's input batch when it can
reach it (:mod:`draftwise.vllm.batch_view`); otherwise :func:`match_rows` recognises requests by
their tokens (each row must extend a known request's tokens by exactly the tokens it emitted).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from draftwise.decision import Key, QueryDecider
from draftwise.trace import RoundRecord


def accepted_of(emitted: int, drafted: int) -> int:
    """Draft tokens accepted when vLLM emitted ``emitted`` tokens for a draft of ``drafted`` (the
    accepted part, then one target token)."""
    return max(0, min(emitted - 1, drafted))


@dataclass
class Pending:
    """The draft a request proposed last step, waiting for vLLM's verdict."""

    arm: int  # index into the arms (the batch mode: into its lengths)
    arm_name: str
    max_draft: int
    drafted: int
    draft_s: float
    key: Key = None  # the learner's context when it chose
    learner: bool = True  # False: no learner chose (nothing could be drafted) — no feedback
    bucket: int = 0  # the batch mode: the load bucket whose learner chose
    priced: Key = None  # a lookup's draft: what its acceptance is predicted by (draftwise.decision.pricing)


@dataclass
class RequestState:
    """One request's tokens, drafters, learner and counters, from its first step to its end."""

    req_id: str
    prompt_len: int
    tokens: list[int]
    drafters: list[Any] = field(default_factory=list)
    decider: QueryDecider | None = None  # its learner's decisions (the request mode)
    routes: dict[int, int] = field(default_factory=dict)  # routed arm → its drafter for this request
    stops: list[Any] = field(default_factory=list)  # each arm's stopping rule (None: none)
    pending: Pending | None = None
    steps: int = 1  # target forwards that emitted tokens (the prefill step counts)
    drafted: int = 0
    accepted: int = 0
    emitted: int = 1
    rounds: int = 0  # learner rounds fed back
    reward_sum: float = 0.0
    pulls: Counter = field(default_factory=Counter)
    last_seen: int = 0

    @property
    def new_tokens(self) -> int:
        return len(self.tokens) - self.prompt_len

    def record(self, pending: Pending, emitted: int, drafted: int, verify: float, draft: float) -> RoundRecord:
        """The round record of the draft proposed last step, now that vLLM emitted ``emitted`` tokens."""
        accepted = accepted_of(emitted, drafted)
        return RoundRecord(
            index=self.rounds, arm=pending.arm, arm_name=pending.arm_name, max_draft=pending.max_draft,
            drafted=drafted, accepted=accepted, emitted=emitted, position=self.new_tokens - emitted,
            accept_probs=[1.0] * accepted + [0.0] * (drafted > accepted),
            draft_s=draft, verify_s=verify,
        )

    def count(self, emitted: int, drafted: int) -> None:
        self.steps += 1
        self.emitted += emitted
        self.drafted += drafted
        self.accepted += accepted_of(emitted, drafted)

    def stats(self) -> dict[str, Any]:
        """What a user reads per request: pulls per arm, MAT, acceptance."""
        return {
            "request_id": self.req_id,
            "prompt_tokens": self.prompt_len,
            "new_tokens": self.new_tokens,
            "steps": self.steps,
            "mat": round(self.emitted / self.steps, 4) if self.steps else 0.0,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.accepted / self.drafted, 4) if self.drafted else 0.0,
            "pulls": dict(self.pulls),
            "mean_reward": round(self.reward_sum / self.rounds, 4) if self.rounds else None,
        }


_synthetic = itertools.count()


def match_rows(states: dict[str, RequestState], sampled: Sequence[Sequence[int]], num_tokens: Sequence[int],
               token_ids: Any) -> list[str]:
    """Request ids of the rows when vLLM's own ids are out of reach: a row belongs to the request
    whose tokens it extends by exactly the tokens it emitted; an unmatched row is a new request.

    ``token_ids`` is the (rows, max_len) token array (numpy); each known request is claimed once.

    >>> import numpy as np
    >>> s = {"a": RequestState("a", 2, [5, 6, 7])}
    >>> match_rows(s, [[8]], [4], np.array([[5, 6, 7, 8]]))
    ['a']
    """
    free = dict(states)
    out: list[str] = []
    for row, emitted in enumerate(sampled):
        n = int(num_tokens[row])
        found = None
        for rid, state in free.items():
            seen = len(state.tokens)
            if seen + len(emitted) != n or not emitted:
                continue
            if _same(token_ids[row], state.tokens):
                found = rid
                break
        if found is None:
            found = f"row-{next(_synthetic)}"
        else:
            del free[found]
        out.append(found)
    return out


def _same(row: Any, tokens: Sequence[int]) -> bool:
    """Whether ``row`` starts with ``tokens`` (checks both ends and a stride through the middle)."""
    n = len(tokens)
    if n == 0:
        return True
    probe = sorted({0, n - 1, *range(0, n, max(1, n // 16))})
    return all(int(row[i]) == tokens[i] for i in probe)
