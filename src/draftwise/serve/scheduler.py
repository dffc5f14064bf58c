"""One worker thread owns the :class:`~draftwise.api.Generator` and drives its batch session; requests reach
it through a bounded queue and hear back through their own asyncio queue.

The worker loop, one round at a time::

    admit waiting jobs while the batch has room  →  drop cancelled jobs (between rounds: exact)
    →  session.step() (one round for every active query)  →  deliver new tokens / results

A job's events are :class:`Tokens`, then one of :class:`Done`, :class:`Failed` or :class:`Cancelled`.
``submit`` never blocks: a full queue raises :class:`Overloaded` (the app answers 503). A cancelled job
(its client went away) leaves the batch before the next round. ``close`` lets every admitted and queued
job finish, then ends the worker. :attr:`Scheduler.problem` says why generation is failing (the latest
job failed on the server's side, or the worker stopped) until a job succeeds again.

This module is the only place that touches the session API (``batch_session``, ``add``, ``step``,
``cancel``, ``active``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from draftwise.errors import DraftwiseError
from draftwise.request import Request

log = logging.getLogger(__name__)


# -- events ---------------------------------------------------------------------------------------------------
@dataclass
class Tokens:
    ids: list[int]


@dataclass
class Done:
    result: Any  # draftwise.trace.GenerationResult


@dataclass
class Failed:
    error: BaseException
    bad_input: bool  # the request was wrong (a DraftwiseError from the engine), not the server


@dataclass
class Cancelled:
    pass


Event = Tokens | Done | Failed | Cancelled


class Overloaded(Exception):
    """The queue is full (or the server is shutting down): try again later."""


@dataclass
class Job:
    """One generation: what to generate, and where its events go (``deliver`` is thread-safe)."""

    prompt_ids: list[int]
    request: Request
    probe: bool = False  # a health check's own generation: not a request, kept out of the metrics
    deliver: Callable[[Event], None] = lambda event: None
    cancelled: threading.Event = field(default_factory=threading.Event)
    queued_at: float = field(default_factory=time.perf_counter)


class Ticket:
    """The request side of a job: its events as an async iterator, and ``cancel``."""

    def __init__(self, job: Job, scheduler: Scheduler) -> None:
        self.job = job
        self.scheduler = scheduler
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def deliver(event: Event) -> None:
            with contextlib.suppress(RuntimeError):  # a closed event loop: nobody is listening any more
                loop.call_soon_threadsafe(self.events.put_nowait, event)

        job.deliver = deliver

    async def next(self) -> Event:
        return await self.events.get()

    def cancel(self) -> None:
        self.scheduler.cancel(self.job)


# -- the worker -----------------------------------------------------------------------------------------------
class Scheduler:
    """A bounded queue in front of one worker thread that runs the generator's batch session.

    ``on_result(result)`` runs on the worker thread after each finished query (metrics, learner state).
    """

    def __init__(self, generator: Any, *, max_batch: int = 32, queue_size: int = 128,
                 on_result: Callable[[Any], None] | None = None,
                 on_cancel: Callable[[], None] | None = None) -> None:
        if max_batch < 1 or queue_size < 0:
            raise DraftwiseError(f"need max_batch ≥ 1 and queue_size ≥ 0 (got {max_batch}, {queue_size})")
        self.generator = generator
        self.max_batch = max_batch
        self.queue_size = queue_size
        self.on_result = on_result
        self.on_cancel = on_cancel
        self._waiting: deque[Job] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._running = 0
        self._thread: threading.Thread | None = None
        self.rounds = 0  # session steps run (for tests and the page)
        self._failure: str | None = None  # the latest server-side failure, until a job succeeds

    # -- the request side (event loop thread) ---------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, name="draftwise-scheduler", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job``; :class:`Overloaded` when the queue is full or the server is closing."""
        with self._cond:
            if self._closing:
                raise Overloaded("the server is shutting down")
            held = self._running + len(self._waiting)
            if held >= self.max_batch + self.queue_size:
                # Jobs queued while the batch has room join it at the next round: they count as running, so
                # the counts match the two limits (the queue only holds what the batch cannot take).
                running = min(held, self.max_batch)
                raise Overloaded(f"{running} requests are running (--max-batch {self.max_batch}) and "
                                 f"{held - running} waiting (--queue-size {self.queue_size})")
            self._waiting.append(job)
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        """Stop ``job``: dropped from the queue now, or from the batch before its next round."""
        job.cancelled.set()
        with self._cond:
            self._cond.notify()

    @property
    def problem(self) -> str | None:
        """Why generation is failing now, or None: the worker stopped, or the latest job that ended failed
        on the server's side (a bad request is not the server's failure)."""
        if self._thread is not None and not self._thread.is_alive() and not self._closing:
            return f"the generation worker stopped ({self._failure})"
        return self._failure

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return self._running

    def close(self, timeout: float | None = None) -> None:
        """Refuse new jobs, let every queued and running job finish, then end the worker."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the worker thread ----------------------------------------------------------------------------------
    def _work(self) -> None:
        active: dict[int, tuple[Any, Job]] = {}  # id(handle) → (handle, job)
        try:
            self._loop(active)
        except BaseException as error:  # a bug: say so to every request rather than leave them waiting
            log.exception("the scheduler stopped")
            self._failure = f"{type(error).__name__}: {error}"
            with self._cond:
                self._closing = True
                jobs = [job for _, job in active.values()] + list(self._waiting)
                self._waiting.clear()
            for job in jobs:
                job.deliver(Failed(error, bad_input=False))

    def _loop(self, active: dict[int, tuple[Any, Job]]) -> None:
        session = self.generator.batch_session(max_batch=self.max_batch)
        while True:
            with self._cond:
                while not active and not self._waiting and not self._closing:
                    self._cond.wait()
                if not active and not self._waiting and self._closing:
                    return
                admitted: list[Job] = []
                while self._waiting and len(active) + len(admitted) < self.max_batch:
                    admitted.append(self._waiting.popleft())
            for job in admitted:
                self._admit(session, job, active)
            self._drop_cancelled(session, active)
            self._running = len(active)
            if not active:
                continue
            try:
                events = session.step()
            except Exception as error:  # a bug or a device error: the batch's requests fail, the next start afresh
                log.exception("a round failed; the batch's %d requests fail", len(active))
                self._failure = f"{type(error).__name__}: {error}"
                for _, job in active.values():
                    job.deliver(Failed(error, bad_input=False))
                active.clear()
                self._running = 0
                session = self.generator.batch_session(max_batch=self.max_batch)
                continue
            self.rounds += 1
            for handle, new_ids in events:
                entry = active.get(id(handle))
                if entry is None:
                    continue
                job = entry[1]
                if new_ids:
                    job.deliver(Tokens(list(new_ids)))
                if handle.done:
                    del active[id(handle)]
                    self._failure = None
                    if self.on_result is not None and not job.probe:
                        try:
                            self.on_result(handle.result)
                        except Exception:  # metrics must never fail a request
                            log.exception("on_result failed")
                    job.deliver(Done(handle.result))
            self._running = len(active)

    def _admit(self, session: Any, job: Job, active: dict[int, tuple[Any, Job]]) -> None:
        if job.cancelled.is_set():
            self._cancelled(job)
            return
        try:
            handle = session.add(job.prompt_ids, job.request)
        except DraftwiseError as error:
            job.deliver(Failed(error, bad_input=True))
            return
        except Exception as error:
            log.exception("admitting a request failed")
            self._failure = f"{type(error).__name__}: {error}"
            job.deliver(Failed(error, bad_input=False))
            return
        active[id(handle)] = (handle, job)

    def _drop_cancelled(self, session: Any, active: dict[int, tuple[Any, Job]]) -> None:
        for key, (handle, job) in list(active.items()):
            if job.cancelled.is_set():
                session.cancel(handle)
                del active[key]
                self._cancelled(job)

    def _cancelled(self, job: Job) -> None:
        if self.on_cancel is not None and not job.probe:
            self.on_cancel()
        job.deliver(Cancelled())

