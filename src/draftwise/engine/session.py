"""A continuous batch of queries over one batched engine, one round at a time.

``session.add(...)`` queues a query (checked at once: a bad one raises and nothing else changes);
``session.step()`` admits queued queries while the batch has room, runs one batched round and
returns each query's new tokens; ``session.cancel(handle)`` drops a query between rounds. A
server drives it from one thread; :meth:`~draftwise.api.Generator.generate_batch` runs it to the end.

Every call holds the lock it is given (a :class:`~draftwise.api.Generator`'s own): threads sharing a
session, or a session and its Generator, take turns, one call (a round, for ``step``) at a time.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from draftwise.engine.batch import BatchEngine, Lane
from draftwise.engine.intake import Intake
from draftwise.engine.query import QuerySettings
from draftwise.errors import DraftwiseError
from draftwise.models.grad_modes import GradModes, interrupted
from draftwise.request import Request, make_request
from draftwise.trace import GenerationResult, summarize

log = logging.getLogger(__name__)


def check_batch_size(max_batch: Any) -> int:
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise DraftwiseError(f"the batch size must be an integer ≥ 1, got {max_batch!r}")
    return max_batch


@dataclass(eq=False)
class BatchQuery:
    """A query of a session: its prompt, what it generated so far, and its result once done."""

    prompt_ids: list[int]
    settings: QuerySettings
    seed: int
    lane: Lane | None = None  # while in the batch
    result: GenerationResult | None = None  # once done (finished, cancelled or interrupted)
    sent: int = field(default=0, repr=False)  # new tokens already handed out by step()

    @property
    def done(self) -> bool:
        return self.result is not None

    @property
    def new_tokens(self) -> list[int]:
        if self.result is not None:
            return self.result.token_ids
        if self.lane is None:
            return []
        return self.lane.query.context[self.lane.query.prompt_len :]


class BatchSession:
    """Queries joining and leaving one batch between rounds (at most ``max_batch`` at once)."""

    def __init__(self, engine: BatchEngine, intake: Intake, lock: Any, max_batch: int = 32) -> None:
        self.engine = engine
        self.intake = intake
        self.lock = lock  # a threading.RLock: the Generator's, so its own calls and the session's take turns
        self.max_batch = check_batch_size(max_batch)
        self.waiting: deque[BatchQuery] = deque()
        self.active: list[BatchQuery] = []

    def add(self, prompt: str | Sequence[int], request: Request | None = None, **settings: Any) -> BatchQuery:
        """Queue a query (``request``, or its fields as keywords, as for
        :meth:`~draftwise.api.Generator.generate`); it joins the batch at the next :meth:`step` with room.
        Bad arguments raise :class:`DraftwiseError` here."""
        ids, query, seed = self.intake.prepare(prompt, make_request(request, settings))
        handle = BatchQuery(ids, query, seed)
        with self.lock:
            self.waiting.append(handle)
        return handle

    @property
    def pending(self) -> int:
        """Queries queued or running."""
        return len(self.waiting) + len(self.active)

    def step(self) -> list[tuple[BatchQuery, list[int]]]:
        """Admit queued queries while there is room, run one round of the batch, retire finished
        queries. Returns each query with the tokens it gained (a finished one has ``result`` set)."""
        with self.lock:
            return self._step()

    def _step(self) -> list[tuple[BatchQuery, list[int]]]:
        self._admit()
        finished = {id(lane) for lane in self.engine.round()}
        events = []
        for handle in list(self.active):
            lane = handle.lane
            assert lane is not None
            if id(lane) in finished:
                self._retire(handle)
            new = handle.new_tokens[handle.sent :]
            handle.sent += len(new)
            if new or handle.done:
                events.append((handle, new))
        return events

    def run(self) -> None:
        """Step until every query is done; Ctrl-C ends every query as ``interrupted`` (what each
        generated is kept, the Generator stays exact) and re-raises nothing."""
        modes = GradModes.now()
        with self.lock:
            try:
                while self.pending:
                    self._step()
            except KeyboardInterrupt as error:
                interrupted(error, modes)
                for handle in list(self.active) + list(self.waiting):
                    self.cancel(handle, "interrupted")

    def cancel(self, handle: BatchQuery, reason: str = "cancelled") -> None:
        """End a query between rounds; its result keeps what it generated."""
        with self.lock:
            if handle.done:
                return
            if handle in self.waiting:
                self.waiting.remove(handle)
                handle.result = GenerationResult([], "", summarize([], 0, 0.0, reason), [], handle.prompt_ids,
                                                 handle.seed)
                return
            self._retire(handle, reason)

    # ------------------------------------------------------------------------------------------
    def _admit(self) -> None:
        """Admit queued queries while there is room, all at once: their prompts share forwards."""
        admitted: list[BatchQuery] = []
        while self.waiting and len(self.active) + len(admitted) < self.max_batch:
            admitted.append(self.waiting.popleft())
        if not admitted:
            return
        device = self.engine.target.device
        try:
            lanes = self.engine.join_many([
                (h.prompt_ids, h.settings, torch.Generator(device=device).manual_seed(h.seed), h.seed)
                for h in admitted])
        except BaseException:
            self.waiting.extendleft(reversed(admitted))  # still queued, as before the step
            raise
        for handle, lane in zip(admitted, lanes):
            handle.lane = lane
            self.active.append(handle)

    def _retire(self, handle: BatchQuery, reason: str | None = None) -> None:
        lane = handle.lane
        assert lane is not None
        outcome = self.engine.leave(lane, reason)
        self.active.remove(handle)
        handle.result = self.intake.result(handle.prompt_ids, outcome, handle.seed, handle.settings.prompt_cut)
