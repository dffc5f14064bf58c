"""The HTTP routes (Starlette): OpenAI's completions and chat completions, streamed or not, plus models,
health, Prometheus metrics, the learner's JSON and its live page.

Every error is OpenAI-shaped (:class:`~draftwise.serve.protocol.APIError`). A request passes the
:mod:`~draftwise.serve.security` guard (host, origin, API key), must be declared JSON and stay under the
body limit (413 as soon as its declared or received size passes it); it is then parsed, checked and
tokenized off the event loop, on one preparing thread, so that other requests and ``/health`` are answered
meanwhile, and queued to the :class:`~draftwise.serve.scheduler.Scheduler`. A client that goes away
cancels its job (the worker drops it before the next round). After a large body the process hands freed
memory back to the system.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from draftwise.errors import DraftwiseError
from draftwise.request import Request as GenerationRequest  # starlette's Request is the HTTP one
from draftwise.request import check_prompt_text
from draftwise.serve.metrics import ServeMetrics
from draftwise.serve.protocol import (
    DEFAULT_COMPLETION_TOKENS,
    APIError,
    Reply,
    SamplingRequest,
    TextStream,
    bad_request,
    check_content_type,
    check_context,
    completion_tokens,
    cut_at_stop,
    finish_reason,
    parse_body,
    parse_chat,
    parse_completion,
    speculative,
    sse,
    usage,
)
from draftwise.serve.scheduler import Cancelled, Done, Failed, Job, Overloaded, Scheduler, Ticket, Tokens
from draftwise.serve.security import Access, Guard

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1  # what a 503 asks the client to wait
DEFAULT_MAX_BODY_BYTES = 4 * 2**20  # a request body above this is refused (413): --max-body-mb
TRIM_ABOVE_BYTES = 2**20  # after a body this large, freed memory goes back to the system
SEED_BITS = 53  # a drawn seed is below 2**53: every JSON client can send it back exactly
PROBE_TIMEOUT_S = 30.0  # how long /health waits for its own one-token generation


@dataclass(frozen=True)
class ServeSettings:
    """How the server treats requests: who may call it, how large a body may be, which seed a request
    without one gets (None: a fresh one each time, returned in the response)."""

    access: Access = field(default_factory=Access)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    seed: int | None = None


def fresh_seed() -> int:
    return secrets.randbits(SEED_BITS)


def trim_memory() -> None:
    """Collect garbage and hand the freed heap back to the system (glibc's malloc_trim; elsewhere only the
    collection): tokenizing a body of megabytes leaves hundreds of megabytes that the allocator keeps."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


_LIBC = _libc()


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused with 413 as soon as its declared size or the bytes received pass
    ``limit`` (the rest is dropped as it comes, never kept)."""
    def too_large(size: str) -> APIError:
        return APIError(413, f"the request body is {size}, over this server's limit of {limit} bytes "
                        "(--max-body-mb); send a shorter prompt", code="request_too_large",
                        headers={"Connection": "close"})

    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        await discard_body(request.stream(), DISCARD_BYTES_FACTOR * limit)
        raise too_large(f"{int(declared)} bytes")
    chunks, size = [], 0
    stream = request.stream()
    async for chunk in stream:
        size += len(chunk)
        if size > limit:
            await discard_body(stream, DISCARD_BYTES_FACTOR * limit)
            raise too_large(f"over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


DISCARD_BYTES_FACTOR = 4  # a refused body is read and dropped up to this many times the limit...
DISCARD_IDLE_S = 0.25  # ...while its bytes keep coming


async def discard_body(stream: AsyncIterator[bytes], budget: int) -> None:
    """Read and drop what a client is still sending of a refused body before answering it.

    Closing a socket with unread bytes makes the kernel reset the connection, and a reset discards
    the 413 the client has not read yet: a client that sends its whole body before reading (as
    HTTP libraries do) would see a broken connection instead of the reason. Nothing is kept, and a
    client that stops sending, or sends more than ``budget`` bytes, is answered at once."""
    dropped = 0
    iterator = aiter(stream)
    while dropped <= budget:
        try:
            chunk = await asyncio.wait_for(anext(iterator), DISCARD_IDLE_S)
        except (StopAsyncIteration, TimeoutError):
            return
        dropped += len(chunk)


@dataclass
class Service:
    """What the routes need: the generator (its tokenizer, context, policy), the scheduler and the metrics."""

    generator: Any
    scheduler: Scheduler
    metrics: ServeMetrics
    model: str  # the name clients send as "model"
    policy: str  # the policy spec, reported with each response
    settings: ServeSettings = field(default_factory=ServeSettings)
    on_shutdown: list[Callable[[], None]] = field(default_factory=list)  # after the worker has stopped
    started: float = field(default_factory=time.time)
    # Parsing, checking and tokenizing run here, one request at a time (tokenizers are not all safe to
    # share between threads), never on the event loop.
    preparing: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="draftwise-prepare"))

    async def off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.preparing, fn, *args)

    def prepare(self, raw: bytes, kind: str) -> tuple[SamplingRequest, list[int], Job]:
        """A request body read into a checked request, its prompt's token ids and its job."""
        body = parse_body(raw)
        checked = parse_chat(body, self.model) if kind == "chat" else parse_completion(body, self.model)
        prompt_ids = self.encode(checked)
        return checked, prompt_ids, self.job(checked, prompt_ids)

    # -- prompts ----------------------------------------------------------------------------------------------
    def encode(self, request: SamplingRequest) -> list[int]:
        """Token ids of the request's prompt: raw text for completions, the chat template for chat."""
        gen, tokenizer = self.generator, self.generator.tokenizer
        try:
            if request.kind == "chat":
                assert request.messages is not None
                if tokenizer is None or not getattr(tokenizer, "chat_template", None):
                    raise bad_request("this model has no chat template; use /v1/completions with a prompt",
                                      param="messages")
                for i, message in enumerate(request.messages):
                    check_prompt_text(message["content"], f"messages[{i}].content")
                ids = tokenizer.apply_chat_template(request.messages, add_generation_prompt=True, tokenize=True)
                ids = ids["input_ids"] if hasattr(ids, "keys") else ids
                return [int(i) for i in ids]
            assert request.prompt is not None
            if isinstance(request.prompt, list):
                return list(gen.encode(request.prompt))
            if tokenizer is None:
                raise bad_request("this model has no tokenizer: send the prompt as token ids", param="prompt")
            check_prompt_text(request.prompt)
            return [int(i) for i in tokenizer(request.prompt, add_special_tokens=True)["input_ids"]]
        except DraftwiseError as error:
            raise bad_request(str(error), param="messages" if request.kind == "chat" else "prompt") from None

    def decode(self, ids: list[int]) -> str:
        tokenizer = self.generator.tokenizer
        return tokenizer.decode(ids, skip_special_tokens=True) if tokenizer is not None else ""

    # -- a request -----------------------------------------------------------------------------------------
    def job(self, request: SamplingRequest, prompt_ids: list[int]) -> Job:
        param = request.max_tokens_field
        context = self.generator.max_context
        max_tokens = request.max_tokens
        if max_tokens is None:
            if request.kind == "chat" and context is not None:  # chat: up to the end of the context, as OpenAI
                max_tokens = max(context - len(prompt_ids), 1)
            else:
                max_tokens = DEFAULT_COMPLETION_TOKENS
        check_context(len(prompt_ids), max_tokens, context, param)
        seed = request.seed
        if seed is None:
            seed = self.settings.seed if self.settings.seed is not None else fresh_seed()
        try:
            checked = GenerationRequest(max_tokens, request.temperature, request.top_k, request.top_p, request.seed,
                                        request.stop, request.ignore_eos)
        except DraftwiseError as error:
            raise bad_request(str(error)) from None
        return Job(prompt_ids, replace(checked, seed=seed))

    def completion(self, result: Any, stops: tuple[str, ...]) -> tuple[str, int]:
        """The text a response returns (cut at a stop string) and the tokens it is made of."""
        text, cut = cut_at_stop(result.text, stops)
        return text, completion_tokens(result.token_ids, text, self.decode) if cut else len(result.token_ids)

    # -- health -----------------------------------------------------------------------------------------------
    _probing: asyncio.Lock | None = field(default=None, init=False, repr=False)

    async def problem(self) -> str | None:
        """Why generation fails, or None. After a failure, one short generation of its own tells whether it
        still fails (a server that no client sends work to any more would otherwise never recover)."""
        problem = self.scheduler.problem
        if problem is None or not self.scheduler.alive:
            return problem
        if self._probing is None:
            self._probing = asyncio.Lock()
        async with self._probing:
            if self.scheduler.problem is None:  # another check's probe succeeded meanwhile
                return None
            job = Job([min(getattr(self.generator, "eos_ids", ()), default=0)], GenerationRequest(1, ignore_eos=True),
                      probe=True)
            ticket = Ticket(job, self.scheduler)
            try:
                self.scheduler.submit(job)
            except Overloaded:
                return problem  # no room to check: the latest failure stands
            try:
                async with asyncio.timeout(PROBE_TIMEOUT_S):
                    while not isinstance(await ticket.next(), (Done, Failed, Cancelled)):
                        pass
            except TimeoutError:
                ticket.cancel()
                return f"{problem}; a one-token check did not finish within {PROBE_TIMEOUT_S:.0f} s"
        return self.scheduler.problem


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def create_app(service: Service) -> Starlette:
    """The ASGI application; its lifespan starts the scheduler and, on shutdown, lets it finish."""

    async def completions(request: Request) -> Response:
        return await generate(request, "completion")

    async def chat_completions(request: Request) -> Response:
        return await generate(request, "chat")

    async def generate(request: Request, kind: str) -> Response:
        size = 0
        try:
            check_content_type(request.headers.get("content-type"))
            raw = await read_body(request, service.settings.max_body_bytes)
            size = len(raw)
            checked, prompt_ids, job = await service.off_loop(service.prepare, raw, kind)
            del raw
            ticket = Ticket(job, service.scheduler)
            try:
                service.scheduler.submit(job)
            except Overloaded as why:
                service.metrics.rejected.inc()
                raise APIError(503, f"the server is busy: {why}; retry after {RETRY_AFTER_S} s",
                               type="server_overloaded", code="queue_full",
                               headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        except APIError as error:
            return error_response(error)
        finally:
            if size >= TRIM_ABOVE_BYTES:  # queued after this request's own preparing, once its garbage is free
                asyncio.get_running_loop().run_in_executor(service.preparing, trim_memory)
        reply = Reply.new(kind, service.model)
        if checked.stream:
            return StreamingResponse(stream(request, ticket, reply, checked, len(prompt_ids)),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await complete(request, ticket, reply, checked, len(prompt_ids))

    async def complete(request: Request, ticket: Ticket, reply: Reply, checked: SamplingRequest,
                       prompt_tokens: int) -> Response:
        watcher = asyncio.create_task(cancel_on_disconnect(request, ticket))
        try:
            while True:
                event = await ticket.next()
                if isinstance(event, Done):
                    result = event.result
                    text, generated = service.completion(result, checked.stop)
                    return JSONResponse(reply.full(text, finish_reason(result.stats.stopped_by),
                                                   usage(prompt_tokens, generated),
                                                   speculative(result.stats, service.policy), ticket.job.request.seed))
                if isinstance(event, Failed):
                    return error_response(failure(event))
                if isinstance(event, Cancelled):
                    return Response(status_code=499)  # nobody is listening; nginx's "client closed request"
        finally:
            watcher.cancel()
            ticket.cancel()  # a no-op once the job is done

    async def stream(request: Request, ticket: Ticket, reply: Reply, checked: SamplingRequest,
                     prompt_tokens: int) -> AsyncIterator[bytes]:
        watcher = asyncio.create_task(cancel_on_disconnect(request, ticket))
        text = TextStream(service.decode, checked.stop)
        try:
            if reply.kind == "chat":
                yield sse(reply.chunk("", first=True))
            while True:
                event = await ticket.next()
                if isinstance(event, Tokens):
                    piece = text.push(event.ids)
                    if piece:
                        yield sse(reply.chunk(piece))
                elif isinstance(event, Done):
                    result = event.result
                    yield sse(reply.chunk(text.finish(result.text),
                                          finish_reason=finish_reason(result.stats.stopped_by),
                                          spec=speculative(result.stats, service.policy), seed=ticket.job.request.seed))
                    if checked.include_usage:
                        yield sse(reply.usage_chunk(usage(prompt_tokens, service.completion(result, checked.stop)[1])))
                    yield sse("[DONE]")
                    return
                elif isinstance(event, Failed):
                    yield sse(failure(event).body())
                    yield sse("[DONE]")
                    return
                else:  # Cancelled: the client is gone
                    return
        finally:
            watcher.cancel()
            ticket.cancel()

    async def cancel_on_disconnect(request: Request, ticket: Ticket) -> None:
        """Wait for the client to go away, then cancel its job (the body is already read)."""
        with contextlib.suppress(Exception):
            while (await request.receive())["type"] != "http.disconnect":
                pass
            ticket.cancel()

    def failure(event: Failed) -> APIError:
        if event.bad_input:
            return bad_request(str(event.error))
        return APIError(500, f"generation failed: {type(event.error).__name__}: {event.error}", type="server_error",
                        code="internal_error")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": service.model, "object": "model", "created": int(service.started), "owned_by": "draftwise",
            "max_model_len": service.generator.max_context, "policy": service.policy,
            "arms": [a.name for a in service.generator.arms]}]})

    async def health(request: Request) -> Response:
        """Readiness: 503 while generation fails (the latest job failed on the server's side and a check of
        its own fails too), else ok."""
        problem = await service.problem()
        if problem is not None:
            return JSONResponse({"status": "unavailable", "error": f"generation is failing: {problem}"},
                                status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request) -> Response:
        body = service.metrics.exposition(service.scheduler.running, service.scheduler.waiting)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def learner(request: Request) -> Response:
        return JSONResponse(service.metrics.snapshot(service.scheduler.running, service.scheduler.waiting))

    async def page(request: Request) -> Response:
        return HTMLResponse(resources.files("draftwise.serve").joinpath("index.html").read_text(encoding="utf-8"))

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        message = {404: f"no route {request.method} {request.url.path}; routes: POST /v1/completions, "
                        "POST /v1/chat/completions, GET /v1/models, /health, /metrics, /v1/learner, /",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(status, str(exc))
        kind = "invalid_request_error" if status < 500 else "server_error"
        return error_response(APIError(status, message, type=kind))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        service.scheduler.start()
        try:
            yield
        finally:  # uvicorn has let every open request finish (SIGTERM): the worker has nothing left to do
            await asyncio.to_thread(service.scheduler.close)
            service.preparing.shutdown(wait=False)
            for hook in service.on_shutdown:
                try:
                    hook()
                except Exception:
                    log.exception("shutdown hook failed")

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/learner", learner, methods=["GET"]),
        Route("/", page, methods=["GET"]),
    ]
    access = service.settings.access
    middleware = [Middleware(Guard, access=access)]
    if access.cors_origins:  # outermost: it answers preflights, and its headers reach every refusal too
        middleware.insert(0, Middleware(CORSMiddleware, allow_origins=list(access.cors_origins),
                                        allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type"]))
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                     exception_handlers={HTTPException: http_error, Exception: http_error})
