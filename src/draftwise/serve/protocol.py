"""The OpenAI wire format: requests checked into :class:`SamplingRequest` (or an :class:`APIError` that
says what is wrong and what is valid), responses and stream chunks, and text released to a stream.

Pure functions and small classes, no web framework: the routes in :mod:`draftwise.serve.app` call them.
"""

from __future__ import annotations

import json
import math
import numbers
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from draftwise.errors import json_error_text
from draftwise.request import SEED_LIMIT

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default; temperature 0 (or below 1e-5) is greedy: exactly the target's argmax path
MAX_STOPS = 4  # as OpenAI
MAX_TEMPERATURE = 2.0  # OpenAI's range is [0, 2]; the library alone takes any temperature ≥ 0


class APIError(Exception):
    """An error answered as OpenAI does: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


# -- requests -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SamplingRequest:
    """One checked request of either endpoint."""

    kind: str  # "completion" or "chat"
    model: str
    prompt: str | list[int] | None  # completions: text or token ids
    messages: list[dict[str, str]] | None  # chat: role / content, text only
    max_tokens: int | None  # None: the endpoint's default (completions 16, chat: the rest of the context)
    max_tokens_field: str  # the field the client set it with (or the endpoint's own): errors name it
    temperature: float
    top_p: float | None
    top_k: int | None
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    ignore_eos: bool


# Fields of OpenAI's API that change nothing at these values and that this server cannot honour at any other:
# accepted at their neutral value, refused by name otherwise.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "best_of": (1,),
    "echo": (False,),
    "logprobs": (False, 0),
    "top_logprobs": (0,),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "logit_bias": ({},),
    "suffix": ("",),
    "tools": ([],),
    "tool_choice": ("none",),
    "functions": ([],),
    "function_call": ("none",),
    "parallel_tool_calls": (False, True),
    "response_format": ({"type": "text"},),
    "modalities": (["text"],),
}
WHY_NOT = {
    "n": "this server returns one choice per request (n=1); send separate requests for more",
    "best_of": "this server returns one choice per request (best_of=1)",
    "logprobs": "log-probabilities are not returned",
    "top_logprobs": "log-probabilities are not returned",
    "tools": "tool calling is not supported",
    "tool_choice": "tool calling is not supported",
    "functions": "function calling is not supported",
    "function_call": "function calling is not supported",
    "response_format": "only plain text ({\"type\": \"text\"}) is supported",
}
IGNORED = ("user", "metadata", "store", "service_tier")  # accepted, no effect
COMMON = ("model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options",
          "ignore_eos")
COMPLETION_FIELDS = frozenset((*COMMON, "prompt", *NEUTRAL, *IGNORED))
CHAT_FIELDS = frozenset((*COMMON, "messages", "max_completion_tokens", *NEUTRAL, *IGNORED))
CHAT_ROLES = ("system", "developer", "user", "assistant")


def check_content_type(value: str | None) -> None:
    """A POST body must be declared JSON: a web page can send ``text/plain`` to any server without asking
    first (no CORS preflight), but not ``application/json``."""
    if (value or "").split(";", 1)[0].strip().lower() != "application/json":
        shown = repr(value) if value else "none"
        raise APIError(415, f"the request body must be sent as Content-Type: application/json (got {shown})",
                       code="unsupported_media_type")


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request's JSON object, or a 400 that says where the JSON broke."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise bad_request("the request body is not UTF-8 text; send a JSON object") from None
    except json.JSONDecodeError as error:
        raise bad_request(f"the request body is not valid JSON ({json_error_text(error)}); send a JSON object "
                          "such as {\"model\": ..., \"prompt\": ...}",
                          code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}", code="invalid_json")
    return body


def parse_completion(body: dict[str, Any], served: str) -> SamplingRequest:
    """``POST /v1/completions``."""
    _check_fields(body, COMPLETION_FIELDS)
    if "prompt" not in body or body["prompt"] is None:
        raise bad_request("missing required field 'prompt' (a string, or a list of token ids)", param="prompt",
                          code="missing_required_parameter")
    return _common(body, served, "completion", prompt=_prompt(body["prompt"]))


def parse_chat(body: dict[str, Any], served: str) -> SamplingRequest:
    """``POST /v1/chat/completions``."""
    _check_fields(body, CHAT_FIELDS)
    if "messages" not in body or body["messages"] is None:
        raise bad_request("missing required field 'messages' (a list of {\"role\", \"content\"} objects)",
                          param="messages", code="missing_required_parameter")
    return _common(body, served, "chat", messages=_messages(body["messages"]))


def _check_fields(body: dict[str, Any], known: frozenset[str]) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise bad_request(f"unrecognized request field {unknown[0]!r}; supported fields: {', '.join(sorted(known))}",
                          param=unknown[0], code="unknown_parameter")
    for name, neutral in NEUTRAL.items():
        value = body.get(name)
        if value is None or any((value == v and type(value) is type(v)) or _same_number(value, v) for v in neutral):
            continue
        why = WHY_NOT.get(name, f"only {neutral[0]!r} is supported")
        raise bad_request(f"{name}={json.dumps(value)} is not supported: {why}", param=name,
                          code="unsupported_parameter")


def _same_number(a: Any, b: Any) -> bool:
    return (isinstance(a, numbers.Real) and not isinstance(a, bool) and isinstance(b, numbers.Real)
            and not isinstance(b, bool) and a == b)


def _common(body: dict[str, Any], served: str, kind: str, *, prompt: str | list[int] | None = None,
            messages: list[dict[str, str]] | None = None) -> SamplingRequest:
    model = body.get("model")
    if model is not None and model != served:
        raise APIError(404, f"the model {model!r} does not exist; this server serves {served!r} (GET /v1/models)",
                       param="model", code="model_not_found")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request(f"stream must be true or false, got {json.dumps(stream)}", param="stream")
    options = body.get("stream_options")
    if options is not None and not stream:
        raise bad_request("stream_options is only allowed when stream is true", param="stream_options")
    options = options or {}
    if (not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}
            or not all(isinstance(v, bool) for v in options.values())):
        raise bad_request("stream_options must be an object such as {\"include_usage\": true}",
                          param="stream_options")
    if options.get("continuous_usage_stats"):
        raise bad_request("stream_options.continuous_usage_stats is not supported; include_usage sends the usage "
                          "in a last chunk", param="stream_options", code="unsupported_parameter")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise bad_request(f"ignore_eos must be true or false, got {json.dumps(ignore_eos)}", param="ignore_eos")
    # chat takes either name (max_tokens is the older one; max_completion_tokens wins when both are set), and
    # errors name the one the client sent: without either, the endpoint's own
    if kind == "chat" and (body.get("max_completion_tokens") is not None or body.get("max_tokens") is None):
        field = "max_completion_tokens"
    else:
        field = "max_tokens"
    return SamplingRequest(
        kind=kind, model=served, prompt=prompt, messages=messages,
        max_tokens=_max_tokens(body.get(field), field), max_tokens_field=field,
        temperature=_temperature(body.get("temperature")), top_p=_top_p(body.get("top_p")),
        top_k=_top_k(body.get("top_k")), seed=_seed(body.get("seed")), stop=_stops(body.get("stop")),
        stream=stream, include_usage=bool(options.get("include_usage", False)), ignore_eos=ignore_eos,
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _prompt(value: Any) -> str | list[int]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # a batch of one prompt
    if isinstance(value, str):
        if not value:
            raise bad_request("prompt is empty; send the text to complete", param="prompt")
        return value
    if isinstance(value, list) and value and all(_is_int(v) for v in value):
        return [int(v) for v in value]
    if isinstance(value, list) and len(value) > 1 and all(isinstance(v, (str, list)) for v in value):
        raise bad_request(f"a batch of {len(value)} prompts is not supported: send one prompt per request",
                          param="prompt", code="unsupported_parameter")
    raise bad_request("prompt must be a non-empty string or a non-empty list of token ids", param="prompt")


def _messages(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise bad_request("messages must be a non-empty list of {\"role\", \"content\"} objects", param="messages")
    out = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_request(f"{where} must be an object with 'role' and 'content'", param=where)
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise bad_request(f"{where}.role {json.dumps(role)} is not supported; valid roles: "
                              f"{', '.join(CHAT_ROLES)}", param=f"{where}.role")
        extra = sorted(set(message) - {"role", "content", "name"})
        if extra:
            raise bad_request(f"{where}.{extra[0]} is not supported (tool calls are not); messages carry role and "
                              "content", param=f"{where}.{extra[0]}", code="unsupported_parameter")
        out.append({"role": "system" if role == "developer" else role,
                    "content": _content(message.get("content"), f"{where}.content")})
    return out


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                       and isinstance(p.get("text"), str) for p in value):
        return "".join(p["text"] for p in value)
    raise bad_request(f"{where} must be a string or a list of {{\"type\": \"text\", \"text\": ...}} parts "
                      "(text only)", param=where)


def _max_tokens(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if not _is_int(value) or value <= 0:
        raise bad_request(f"{name} must be a positive integer, got {json.dumps(value)}", param=name)
    return int(value)


def _temperature(value: Any) -> float:
    if value is None:
        return DEFAULT_TEMPERATURE
    if not (_is_number(value) and math.isfinite(value) and 0 <= value <= MAX_TEMPERATURE):
        raise bad_request(f"temperature must be a number in [0, {MAX_TEMPERATURE:g}] (0 = greedy), got "
                          f"{json.dumps(value)}", param="temperature")
    return float(value)


def _top_p(value: Any) -> float | None:
    if value is None:
        return None
    if not (_is_number(value) and 0 < value <= 1):
        raise bad_request(f"top_p must lie in (0, 1], got {json.dumps(value)}", param="top_p")
    return None if value == 1 else float(value)


def _top_k(value: Any) -> int | None:
    if value is None or (_is_int(value) and value in (-1, 0)):  # vLLM's "no top-k"
        return None
    if not _is_int(value) or value < 1:
        raise bad_request(f"top_k must be an integer ≥ 1 (or -1 for none), got {json.dumps(value)}", param="top_k")
    return int(value)


def _seed(value: Any) -> int | None:
    if value is None:
        return None
    if not _is_int(value) or not 0 <= value < SEED_LIMIT:
        raise bad_request(f"seed must be an integer in [0, 2**64), got {json.dumps(value)}", param="seed")
    return int(value)


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if (not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops)
            or len(stops) > MAX_STOPS):
        raise bad_request(f"stop must be a non-empty string or a list of at most {MAX_STOPS} non-empty strings, got "
                          f"{json.dumps(value)}", param="stop")
    return tuple(stops)


def check_context(prompt_tokens: int, max_tokens: int, context: int | None, param: str) -> None:
    """The prompt and the tokens asked for must fit the target's context."""
    if context is None or prompt_tokens + max_tokens <= context:
        return
    room = context - prompt_tokens
    hint = f"{param} ≤ {room}" if room > 0 else "a shorter prompt"
    raise bad_request(f"this model's context is {context} tokens; the prompt has {prompt_tokens} and {param} asks "
                      f"for {max_tokens} more ({prompt_tokens + max_tokens} in all); ask for {hint}", param=param,
                      code="context_length_exceeded")


# -- responses ----------------------------------------------------------------------------------------------
def finish_reason(stopped_by: str) -> str:
    """OpenAI's finish_reason for the engine's ``stopped_by``: stop (EOS or a stop string) or length."""
    return {"eos": "stop", "stop_string": "stop", "max_new_tokens": "length"}.get(stopped_by, stopped_by)


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def completion_tokens(ids: Sequence[int], text: str, decode: Callable[[list[int]], str]) -> int:
    """How many of the generated ``ids`` the returned ``text`` (cut at a stop string) is made of: the
    shortest prefix whose decoding holds it. Tokens generated past the cut do not count, wherever the
    rounds happened to end.

    >>> completion_tokens([ord(c) for c in "ab(cd"], "ab", lambda ids: "".join(map(chr, ids)))
    2
    """
    n = len(ids)
    while n > 0 and decode(list(ids[: n - 1])).startswith(text):
        n -= 1
    return n


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def speculative(stats: Any, policy: str) -> dict[str, Any]:
    """What speculation did for one response: tokens per target forward (MAT, the bonus token counted),
    accepted / drafted, and how often the policy played each arm."""
    return {"policy": policy, "mat": round(stats.mat, 4), "acceptance_rate": round(stats.acceptance_rate, 4),
            "rounds": stats.rounds, "target_calls": stats.target_calls, "drafted": stats.drafted,
            "accepted": stats.accepted, "pulls": dict(stats.pulls)}


@dataclass
class Reply:
    """The identity of one response, shared by its chunks."""

    kind: str
    model: str
    id: str
    created: int

    @classmethod
    def new(cls, kind: str, model: str) -> Reply:
        return cls(kind, model, new_id(kind), int(time.time()))

    def _head(self, chunk: bool) -> dict[str, Any]:
        if self.kind == "chat":
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, text: str, finish_reason: str | None, use: dict[str, int], spec: dict[str, Any],
             seed: int | None) -> dict[str, Any]:
        if self.kind == "chat":
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice.update(logprobs=None, finish_reason=finish_reason)
        return {**self._head(False), "choices": [choice], "usage": use, "seed": seed, "speculative": spec}

    def chunk(self, text: str, *, first: bool = False, finish_reason: str | None = None,
              spec: dict[str, Any] | None = None, seed: int | None = None) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
            choice: dict[str, Any] = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text}
        choice.update(logprobs=None, finish_reason=finish_reason)
        out = {**self._head(True), "choices": [choice]}
        if spec is not None:  # the chunk that finishes the choice carries the seed and the speculative block
            out["seed"] = seed
            out["speculative"] = spec
        return out

    def usage_chunk(self, use: dict[str, int]) -> dict[str, Any]:
        """The last chunk of a stream asked for ``stream_options.include_usage``: no choice, the usage."""
        return {**self._head(True), "choices": [], "usage": use}


def sse(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line (``data: [DONE]`` ends a stream)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


# -- text released to a stream -------------------------------------------------------------------------------
def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to the first stop string (excluded, as OpenAI), and whether one was found."""
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)


class TextStream:
    """Text released as tokens arrive, so that the released pieces add up to the final text exactly.

    Held back until they settle: a trailing replacement character (a multi-byte character split
    across tokens) and a tail that could begin a stop string. Text past a stop string is never released.

    >>> stream = TextStream(lambda ids: "".join(chr(i) for i in ids), stops=["!!"])
    >>> stream.push([ord("h"), ord("i"), ord("!")]), stream.push([ord("!"), ord("x")]), stream.finish("hi!!x")
    ('hi', '', '')
    """

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str] = ()) -> None:
        self.decode = decode
        self.stops = list(stops)
        self.tokens: list[int] = []
        self.sent = 0  # characters released so far
        self.stopped = False

    def push(self, ids: Sequence[int]) -> str:
        self.tokens.extend(ids)
        if self.stopped or not ids:
            return ""
        text, self.stopped = cut_at_stop(self.decode(self.tokens), self.stops)
        end = len(text) if self.stopped else len(text) - self._unsettled(text)
        return self._release(text, end)

    def finish(self, final_text: str) -> str:
        """The rest of ``final_text`` (the whole response's text), cut at a stop string."""
        text, _ = cut_at_stop(final_text, self.stops)
        return self._release(text, len(text))

    def _unsettled(self, text: str) -> int:
        held = len(text) - len(text.rstrip("\ufffd"))
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:k]):
                    held = max(held, k)
                    break
        return held

    def _release(self, text: str, end: int) -> str:
        if end <= self.sent:
            return ""
        piece = text[self.sent : end]
        self.sent = end
        return piece
