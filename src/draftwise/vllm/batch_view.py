"""What the proposer can learn about the step beyond ``propose``'s arguments.

vLLM (0.32, V1 model runner) calls ``propose(sampled_token_ids, num_tokens_no_spec,
token_ids_cpu, slot_mappings=...)`` from ``GPUModelRunner.propose_draft_token_ids`` (the CPU
runner inherits it), whose frame holds the runner (``self``: its ``input_batch.req_ids`` name the
rows, its ``requests`` every request not finished) and the step's ``scheduler_output`` (tokens
scheduled per request, the draft tokens actually verified, the requests that finished — reported
once, possibly in a step that has no rows and no ``propose`` call, hence ``requests`` too).
:func:`read_view` reads them from the calling frame and
returns None when the caller is anything else (another vLLM version): the proposer then
identifies rows by their tokens and counts steps from its own drafts.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import FrameType
from typing import Any


@dataclass(frozen=True)
class BatchView:
    req_ids: list[str]  # one per row
    prompt_lens: list[int]  # one per row
    scheduled: dict[str, int]  # tokens scheduled this step per request (prefill chunks included)
    spec_tokens: dict[str, int]  # draft tokens verified this step per request
    finished: frozenset[str]  # requests that finished since the last step
    known: frozenset[str] | None = None  # every request the runner still holds (running or preempted)

    @property
    def requests(self) -> int:
        return len(self.scheduled)

    @property
    def draft_tokens(self) -> int:
        return sum(self.spec_tokens.values())

    @property
    def prompt_tokens(self) -> int:
        """Scheduled tokens beyond one per request that are not drafts (prefill chunks)."""
        return max(0, sum(self.scheduled.values()) - len(self.scheduled) - self.draft_tokens)


def read_view(frame: FrameType | None, rows: int) -> BatchView | None:
    """The batch view from vLLM's calling frame, or None if it is not the expected caller."""
    try:
        if frame is None or frame.f_code.co_name != "propose_draft_token_ids":
            return None
        local = frame.f_locals
        runner, output = local.get("self"), local.get("scheduler_output")
        batch = getattr(runner, "input_batch", None)
        if runner is None or batch is None or output is None:
            return None
        ids = list(batch.req_ids[:rows])
        if len(ids) != rows or any(i is None for i in ids):
            return None
        prompt = batch.num_prompt_tokens
        spec = getattr(output, "scheduled_spec_decode_tokens", {}) or {}
        return BatchView(
            req_ids=ids,
            prompt_lens=[int(prompt[i]) for i in range(rows)],
            scheduled=dict(output.num_scheduled_tokens),
            spec_tokens={rid: len(tokens) for rid, tokens in spec.items()},
            finished=frozenset(getattr(output, "finished_req_ids", ()) or ()),
            known=frozenset(runner.requests) if isinstance(getattr(runner, "requests", None), dict) else None,
        )
    except (AttributeError, TypeError, IndexError, KeyError):
        return None


def caller_view(rows: int, depth: int = 2) -> BatchView | None:
    """:func:`read_view` on the frame ``depth`` levels above this function."""
    try:
        frame: Any = sys._getframe(depth)
    except ValueError:
        return None
    return read_view(frame, rows)
