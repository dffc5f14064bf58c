"""The HTTP routes (Starlette): OpenAI's completions and chat completions, streamed or not, plus models,
health, Prometheus metrics, the learner's JSON and its live page.

Every error is OpenAI-shaped (:class:`~draftwise.serve.protocol.APIError`). Requests are checked and
tokenized here, on the event loop, then queued to the :class:`~draftwise.serve.scheduler.Scheduler`; a
client that goes away cancels its job (the worker drops it before the next round).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from draftwise.api import check_generate_args, check_prompt_text
from draftwise.errors import DraftwiseError
from draftwise.serve.metrics import ServeMetrics
from draftwise.serve.protocol import (
    DEFAULT_COMPLETION_TOKENS,
    APIError,
    Reply,
    SamplingRequest,
    TextStream,
    bad_request,
    check_context,
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

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1  # what a 503 asks the client to wait


@dataclass
class Service:
    """What the routes need: the generator (its tokenizer, context, policy), the scheduler and the metrics."""

    generator: Any
    scheduler: Scheduler
    metrics: ServeMetrics
    model: str  # the name clients send as "model"
    policy: str  # the policy spec, reported with each response
    on_shutdown: list[Callable[[], None]] = field(default_factory=list)  # after the worker has stopped
    started: float = field(default_factory=time.time)

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
        param = "max_completion_tokens" if request.kind == "chat" else "max_tokens"
        context = self.generator.max_context
        max_tokens = request.max_tokens
        if max_tokens is None:
            if request.kind == "chat" and context is not None:  # chat: up to the end of the context, as OpenAI
                max_tokens = max(context - len(prompt_ids), 1)
            else:
                max_tokens = DEFAULT_COMPLETION_TOKENS
        check_context(len(prompt_ids), max_tokens, context, param)
        try:
            check_generate_args(max_tokens, request.temperature, request.top_k, request.top_p, request.seed)
        except DraftwiseError as error:
            raise bad_request(str(error)) from None
        return Job(prompt_ids, max_tokens, temperature=request.temperature, top_k=request.top_k,
                   top_p=request.top_p, seed=request.seed, stop=request.stop, ignore_eos=request.ignore_eos)


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def create_app(service: Service) -> Starlette:
    """The ASGI application; its lifespan starts the scheduler and, on shutdown, lets it finish."""

    async def completions(request: Request) -> Response:
        return await generate(request, "completion")

    async def chat_completions(request: Request) -> Response:
        return await generate(request, "chat")

    async def generate(request: Request, kind: str) -> Response:
        try:
            body = parse_body(await request.body())
            checked = parse_chat(body, service.model) if kind == "chat" else parse_completion(body, service.model)
            prompt_ids = service.encode(checked)
            job = service.job(checked, prompt_ids)
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
                    text, _ = cut_at_stop(result.text, checked.stop)
                    return JSONResponse(reply.full(text, finish_reason(result.stats.stopped_by),
                                                   usage(prompt_tokens, len(result.token_ids)),
                                                   speculative(result.stats, service.policy)))
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
                                          use=usage(prompt_tokens, len(result.token_ids)),
                                          spec=speculative(result.stats, service.policy)))
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
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={HTTPException: http_error, Exception: http_error})
