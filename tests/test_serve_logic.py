"""``draftwise serve`` without a model: request checking, stream text, learner state files, and the app on a
fake batch session (queue full → 503, a client that goes away stops its generation, shutdown finishes work).
The real server on the zoo is tests/test_serve.py."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from draftwise.errors import DraftwiseError
from draftwise.policies import make_policy
from draftwise.request import Request
from draftwise.serve.protocol import (
    APIError,
    TextStream,
    check_context,
    cut_at_stop,
    parse_body,
    parse_chat,
    parse_completion,
)
from draftwise.serve.state import load_state, read_state, save_state
from draftwise.trace import GenerationResult, RoundRecord, summarize

MODEL = "zoo:target"


# ----------------------------------------------------------------------------- requests
def _error(fn: Any, *args: Any) -> APIError:
    with pytest.raises(APIError) as caught:
        fn(*args)
    return caught.value


@pytest.mark.parametrize("body, status, param, words", [
    ({}, 400, "prompt", "missing required field 'prompt'"),
    ({"prompt": "hi", "max_tokens": 0}, 400, "max_tokens", "max_tokens must be a positive integer, got 0"),
    ({"prompt": "hi", "max_tokens": -5}, 400, "max_tokens", "positive integer"),
    ({"prompt": "hi", "max_tokens": 2.5}, 400, "max_tokens", "positive integer"),
    ({"prompt": "hi", "temperature": -0.1}, 400, "temperature", "temperature must be a number in [0, 2] (0 = greedy)"),
    ({"prompt": "hi", "temperature": 3}, 400, "temperature", "must be a number in [0, 2] (0 = greedy), got 3"),
    ({"prompt": "hi", "temperature": 2.01}, 400, "temperature", "temperature must be a number in [0, 2]"),
    ({"prompt": "hi", "stop": ""}, 400, "stop", "stop must be a non-empty string"),
    ({"prompt": [1.5, 2.0]}, 400, "prompt", "prompt must be a non-empty string or a non-empty list of token ids"),
    ({"prompt": [True, 2]}, 400, "prompt", "prompt must be a non-empty string or a non-empty list of token ids"),
    ({"prompt": "hi", "top_p": 0}, 400, "top_p", "top_p must lie in (0, 1]"),
    ({"prompt": "hi", "top_p": 1.5}, 400, "top_p", "top_p must lie in (0, 1]"),
    ({"prompt": "hi", "model": "gpt-4"}, 404, "model", "the model 'gpt-4' does not exist; this server serves"),
    ({"prompt": "hi", "n": 2}, 400, "n", "n=2 is not supported: this server returns one choice"),
    ({"prompt": "hi", "logprobs": 5}, 400, "logprobs", "logprobs=5 is not supported"),
    ({"prompt": "hi", "frobnicate": 1}, 400, "frobnicate", "unrecognized request field 'frobnicate'"),
    ({"prompt": ["a", "b"]}, 400, "prompt", "a batch of 2 prompts is not supported"),
    ({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "at most 4"),
    ({"prompt": "hi", "seed": -1}, 400, "seed", "seed must be an integer in [0, 2**64)"),
    ({"prompt": "hi", "stream": "yes"}, 400, "stream", "stream must be true or false"),
])
def test_completion_requests_are_refused_with_what_is_valid(body, status, param, words):
    error = _error(parse_completion, body, MODEL)
    assert error.status == status and error.param == param, error.body()
    assert words in error.message, error.message
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("body, param, words", [
    ({}, "messages", "missing required field 'messages'"),
    ({"messages": []}, "messages", "non-empty list"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "valid roles: system, developer, user"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content", "must be a string"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0].tool_calls", "not supported"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools",
     "tool calling is not supported"),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, "max_completion_tokens",
     "positive integer"),
])
def test_chat_requests_are_refused_with_what_is_valid(body, param, words):
    error = _error(parse_chat, body, MODEL)
    assert error.status == 400 and error.param == param and words in error.message, error.body()


def test_temperature_follows_openai_range_inclusive():
    assert parse_completion({"prompt": "hi", "temperature": 2}, MODEL).temperature == 2.0
    assert parse_completion({"prompt": "hi", "temperature": 0}, MODEL).temperature == 0.0


@pytest.mark.parametrize("fields, field, value", [
    ({"max_tokens": 7}, "max_tokens", 7),
    ({"max_completion_tokens": 7}, "max_completion_tokens", 7),
    ({"max_tokens": 5, "max_completion_tokens": 7}, "max_completion_tokens", 7),
    ({"max_tokens": 7, "max_completion_tokens": None}, "max_tokens", 7),
    ({}, "max_completion_tokens", None),
])
def test_chat_remembers_which_length_field_the_client_sent(fields, field, value):
    chat = parse_chat({"messages": [{"role": "user", "content": "x"}], **fields}, MODEL)
    assert (chat.max_tokens_field, chat.max_tokens) == (field, value)
    assert parse_completion({"prompt": "x", "max_tokens": 3}, MODEL).max_tokens_field == "max_tokens"


def test_good_requests_and_neutral_fields_are_accepted():
    req = parse_completion({"model": MODEL, "prompt": "hi", "max_tokens": 3, "temperature": 0, "n": 1, "top_p": 1,
                            "logprobs": None, "presence_penalty": 0, "stop": "x", "user": "u"}, MODEL)
    assert (req.prompt, req.max_tokens, req.temperature, req.top_p, req.stop) == ("hi", 3, 0.0, None, ("x",))
    chat = parse_chat({"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}]},
                                    {"role": "user", "content": "b"}], "stream": True,
                       "stream_options": {"include_usage": True}}, MODEL)
    assert chat.messages == [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}]
    assert chat.stream and chat.include_usage and chat.temperature == 1.0  # OpenAI's default


def test_malformed_json_and_context_overflow():
    assert "not valid JSON" in _error(parse_body, b'{"prompt": ').message
    message = _error(parse_body, b'{"prompt": "hi').message
    assert "not valid JSON (Unterminated string starting at line 1, column 12); send a JSON object" in message
    assert "must be a JSON object" in _error(parse_body, b"[1, 2]").message
    error = _error(check_context, 1000, 100, 1024, "max_tokens")
    assert error.code == "context_length_exceeded" and "ask for max_tokens ≤ 24" in error.message
    check_context(1000, 24, 1024, "max_tokens")


# ----------------------------------------------------------------------------- stream text
def _chars(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


@pytest.mark.parametrize("text, stops, expected", [
    ("hello world", [], "hello world"),
    ("say STOP now", ["STOP"], "say "),
    ("abcabd", ["abd"], "abc"),
    ("no stop here", ["zz"], "no stop here"),
])
def test_stream_pieces_add_up_to_the_final_text(text, stops, expected):
    for size in (1, 2, 3):
        stream = TextStream(_chars, stops)
        ids = [ord(c) for c in text]
        pieces = [stream.push(ids[i:i + size]) for i in range(0, len(ids), size)]
        pieces.append(stream.finish(text))
        assert "".join(pieces) == expected == cut_at_stop(text, stops)[0]


def test_stream_holds_back_a_split_multibyte_character():
    raw = "é!".encode()
    stream = TextStream(lambda ids: bytes(ids).decode("utf-8", errors="replace"))
    assert stream.push([raw[0]]) == ""
    assert stream.push([raw[1]]) == "é"
    assert stream.push([raw[2]]) + stream.finish("é!") == "!"


# ----------------------------------------------------------------------------- learner state
def _record(arm: int, accepted: int, index: int = 0) -> RoundRecord:
    return RoundRecord(index=index, arm=arm, arm_name=str(arm), max_draft=4, drafted=4, accepted=accepted,
                       emitted=accepted + 1, position=0, accept_probs=[1.0] * accepted + [0.0] * (4 - accepted),
                       draft_s=0.001, verify_s=0.002)


def _exercised(spec: str, arms: list[str]) -> Any:
    """A learner after three queries of feedback (contexts, bandit or full-information)."""
    policy = make_policy(spec, arms, np.random.default_rng(0))
    for q in range(3):
        policy.begin_query()
        for i in range(20):
            policy.set_context((i % 3 == 0,))
            arm = policy.select()
            if policy.full_information:
                policy.observe_losses([((a + q + i) % 5) / 5 for a in range(len(arms))])
            else:
                policy.update(arm, _record(arm, (arm + q + i) % 5, i))
    return policy


def _arms_for(spec: str) -> list[str]:
    return ["pld@8", "auto@4", "none"] if spec.startswith("ctx") else ["a+static", "a+svip", "b+static"]


def _every_policy() -> list[str]:
    from draftwise.policies import POLICIES, policy_options

    return [f"{name}:keep=True" if "keep" in policy_options(name) else name for name in sorted(POLICIES)]


@pytest.mark.parametrize("spec", ["ctx-ucb", "ctx-ucb:opening=16", *_every_policy()])
def test_every_learner_state_round_trips_through_json(tmp_path, spec, caplog):
    arms = _arms_for(spec)
    policy = _exercised(spec, arms)
    path, again = tmp_path / "state.json", tmp_path / "again.json"
    with caplog.at_level("WARNING"):
        save_state(path, policy, spec)
    assert not caplog.records  # nothing left out (sets and caches included)
    saved = json.loads(path.read_text())  # plain JSON (no pickle)
    fresh = make_policy(spec, arms, np.random.default_rng(0))
    assert load_state(path, fresh, spec)
    save_state(again, fresh, spec)
    assert json.loads(again.read_text()) == saved
    # both choose alike from the next query on (same generator state)
    policy.rng, fresh.rng = np.random.default_rng(5), np.random.default_rng(5)
    for p in (policy, fresh):
        p.begin_query()
    assert fresh.state_dict() == policy.state_dict()
    assert [policy.select() for _ in range(10)] == [fresh.select() for _ in range(10)]


def test_sets_and_frozensets_round_trip():
    from draftwise.serve.state import _encode, _value

    encoded = json.loads(json.dumps(_encode({"pld", "suffix"})))
    assert _value(encoded, {"x"}, "s") == {"pld", "suffix"}
    assert _value(json.loads(json.dumps(_encode(frozenset({3, 1})))), frozenset({0}), "s") == frozenset({1, 3})
    assert "cached" not in json.dumps(_encode([{"a"}]))


def _saved_ctx_ucb(tmp_path) -> tuple[Any, dict[str, Any]]:
    policy = _exercised("ctx-ucb:opening=16", _arms_for("ctx-ucb"))
    path = tmp_path / "state.json"
    save_state(path, policy, "ctx-ucb:opening=16")
    return path, json.loads(path.read_text())


def _encoded_array(values: list[float]) -> dict[str, Any]:
    return {"__ndarray__": values, "dtype": "float64", "shape": [len(values)]}


@pytest.mark.parametrize("edit, words", [
    (lambda a: a.update(pulls="garbage"), 'ContextualUCBPolicy.pulls is "garbage", expected an array of shape [3]'),
    (lambda a: a.update(pulls=_encoded_array([1.0, 2.0])), "ContextualUCBPolicy.pulls has shape [2], expected [3]"),
    (lambda a: a.update(select=5), "ContextualUCBPolicy.select is a method of ContextualUCBPolicy"),
    (lambda a: a.update(frobnicate=1), "frobnicate is not an attribute of ContextualUCBPolicy; its saved state is "
                                       "queries, pulls, sums, t, key, stored"),
    (lambda a: a.pop("sums"), "ContextualUCBPolicy lacks sums"),
    (lambda a: a.update(t="3"), 'ContextualUCBPolicy.t is "3", expected a number'),
    (lambda a: a.update(queries=1.5), "ContextualUCBPolicy.queries is 1.5, expected an integer"),
    (lambda a: a.update(sums=_encoded_array([1.0, float("nan"), 0.0])), "ContextualUCBPolicy.sums holds NaN"),
    (lambda a: a.update(pulls=_encoded_array([1.0, -4.0, 0.0])), "negative counts"),
    (lambda a: a.update(key="x"), 'ContextualUCBPolicy.key is "x", expected null or a tuple of 1'),
    (lambda a: a.update(stored={"__dict__": [[None, {"__tuple__": [1, 2, 3]}]]}),
     "ContextualUCBPolicy.stored[None][0] is 1, expected an array of shape [3]"),
    (lambda a: a.update(pulls={"__ndarray__": ["a", "b", "c"], "dtype": "float64", "shape": [3]}),
     "ContextualUCBPolicy.pulls must hold float64 numbers"),
])
def test_a_state_that_parses_but_holds_wrong_values_is_refused_naming_it(tmp_path, edit, words):
    path, document = _saved_ctx_ucb(tmp_path)
    edit(document["state"]["attrs"])
    path.write_text(json.dumps(document))
    with pytest.raises(DraftwiseError) as caught:
        read_state(path, "ctx-ucb:opening=16")  # the schema needs no model
    message = str(caught.value)
    assert "the learner state is damaged" in message and words in message, message
    assert "\n" not in message


def test_configuration_and_per_query_state_in_a_file_are_ignored_not_loaded(tmp_path):
    path, document = _saved_ctx_ucb(tmp_path)
    document["state"]["attrs"].update(beta=99.0, leaders={"__dict__": []}, model_arms=[7], rng=None)
    path.write_text(json.dumps(document))
    fresh = make_policy("ctx-ucb:opening=16", _arms_for("ctx-ucb"), np.random.default_rng(0))
    assert load_state(path, fresh, "ctx-ucb:opening=16")
    assert fresh.beta == 0.25 and fresh.model_arms == [1] and fresh.rng is not None


@pytest.mark.parametrize("spec, edit, words", [
    ("halving", lambda a: a.update(survivors=[0, 7]), "survivors [0, 7] are not distinct arms of 0..2"),
    ("swucb:keep=True", lambda a: a.update(history={"__deque__": [{"__tuple__": [9, 1.0]}], "maxlen": None}),
     "the window names arms outside 0..2"),
    ("hierarchical:keep=True", lambda a: a["inner"].pop(), "HierarchicalPolicy.inner holds 1 learners, expected 2"),
    ("hierarchical:keep=True", lambda a: a["outer"].update({"__object__": "os:system"}),
     "HierarchicalPolicy.outer is a 'os:system', expected draftwise.policies.ucb:UCBPolicy"),
    ("normalhedge:keep=True", lambda a: a["learner"]["attrs"].update(regrets=[1, 2, 3]),
     "NormalHedgePolicy.learner.regrets is [1, 2, 3], expected an array of shape [3]"),
])
def test_every_learner_checks_its_own_values(tmp_path, spec, edit, words):
    policy = _exercised(spec, _arms_for(spec))
    path = tmp_path / "state.json"
    save_state(path, policy, spec)
    document = json.loads(path.read_text())
    edit(document["state"]["attrs"])
    path.write_text(json.dumps(document))
    with pytest.raises(DraftwiseError, match="the learner state is damaged") as caught:
        read_state(path, spec)
    assert words in str(caught.value), caught.value


def test_state_from_another_layout_or_a_damaged_file_is_refused(tmp_path):
    policy = make_policy("ucb", ["a", "b"], np.random.default_rng(0))
    path = tmp_path / "state.json"
    save_state(path, policy, "ucb")
    with pytest.raises(DraftwiseError, match=r"saved for arms \['a', 'b'\], but this server's arms are"):
        load_state(path, make_policy("ucb", ["a", "b", "c"], np.random.default_rng(0)), "ucb")
    with pytest.raises(DraftwiseError, match="saved by policy 'ucb'"):
        load_state(path, make_policy("exp3", ["a", "b"], np.random.default_rng(0)), "exp3")
    assert not load_state(tmp_path / "absent.json", policy, "ucb")
    path.write_text('{"format": "draftwise-learner-state", "version": 1, "st')
    with pytest.raises(DraftwiseError, match=r"not a learner state file \(invalid JSON"):
        read_state(path, "ucb")
    path.write_text('{"format": "draftwise-learner-state", "version": 99, "state": {}}')
    with pytest.raises(DraftwiseError, match="version 99"):
        read_state(path, "ucb")
    document = json.loads(json.dumps({"format": "draftwise-learner-state", "version": 1, "policy": "ucb",
                                      "class": "draftwise.policies.ucb:UCBPolicy", "arms": ["a", "b"],
                                      "state": {"__object__": "os:system", "attrs": {}}}))
    path.write_text(json.dumps(document))
    with pytest.raises(DraftwiseError, match="damaged"):
        load_state(path, make_policy("ucb", ["a", "b"], np.random.default_rng(0)), "ucb")


@pytest.mark.parametrize("edit, words", [
    (None, "not a learner state file"),
    (lambda a: a.update(pulls="garbage"), 'ContextualUCBPolicy.pulls is "garbage"'),
    (lambda a: a.update(select=5), "ContextualUCBPolicy.select is a method"),
])
def test_serve_refuses_a_damaged_state_file_before_loading(tmp_path, capsys, monkeypatch, edit, words):
    import draftwise.api
    from draftwise.cli import main

    def no_loading(*args, **kwargs):
        raise AssertionError("the models were loaded before the state file was checked")

    monkeypatch.setattr(draftwise.api.Generator, "from_pretrained", no_loading)
    if edit is None:
        bad = tmp_path / "state.json"
        bad.write_text("not json")
    else:
        bad, document = _saved_ctx_ucb(tmp_path)
        edit(document["state"]["attrs"])
        bad.write_text(json.dumps(document))
    assert main(["serve", "--state", str(bad), "--port", "0", "--policy", "ctx-ucb:opening=16"]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err
    assert main(["serve", "--port", "70000"]) == 2
    assert "--port must lie in [0, 65535]" in capsys.readouterr().err


@pytest.mark.parametrize("content, words", [
    ('{"format": "draftwise-learner-state", "st', "not a learner state file (invalid JSON: Unterminated string "
     "starting at line 1, column 39); pass a file that draftwise serve --state saved, or remove it to start afresh"),
    ('{"a\x01": 1}', "(invalid JSON: Invalid control character at line 1, column 4); pass a file"),
    ("not json", "(invalid JSON: Expecting value at line 1, column 1); pass a file"),
    (None, "is a folder; give a file name such as {path}/state.json"),
])
def test_serve_says_plainly_what_is_wrong_with_a_state_path(tmp_path, capsys, monkeypatch, content, words):
    import draftwise.api
    from draftwise.cli import main

    def no_loading(*args, **kwargs):
        raise AssertionError("the models were loaded before the state file was checked")

    monkeypatch.setattr(draftwise.api.Generator, "from_pretrained", no_loading)
    path = tmp_path / ("states" if content is None else "state.json")
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    assert main(["serve", "--state", str(path), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert f"--state{':' if content is None else ''} {path}" in err, err
    assert words.format(path=path) in err and len(err.strip().splitlines()) == 1, err
    assert "at at " not in err and "trace" not in err, err


# ----------------------------------------------------------------------------- the app on a fake session
class FakeTokenizer:
    chat_template = "{{ messages }}"

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        if text.startswith("slow"):  # a tokenizer busy for a while, holding the interpreter
            end = time.perf_counter() + 1.0
            while time.perf_counter() < end:
                pass
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return _chars(ids)

    def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: Any) -> list[int]:
        return [ord(c) for c in "".join(m["content"] for m in messages) + ">"]


class FakeHandle:
    def __init__(self, prompt: list[int], max_new_tokens: int) -> None:
        self.prompt, self.max_new_tokens = prompt, max_new_tokens
        self.new_tokens: list[int] = []
        self.records: list[RoundRecord] = []
        self.done = False
        self.result: GenerationResult | None = None


class FakeSession:
    """The batch-session contract: each round every query gains its prompt's next character, upper-cased."""

    def __init__(self, gen: FakeGenerator, max_batch: int) -> None:
        self.gen, self.max_batch = gen, max_batch
        self.active: list[FakeHandle] = []

    def add(self, prompt_ids, request):
        max_new_tokens = request.max_new_tokens
        if max_new_tokens > 1000:
            raise DraftwiseError("too many")
        handle = FakeHandle(list(prompt_ids), max_new_tokens)
        self.active.append(handle)
        return handle

    def step(self):
        time.sleep(self.gen.round_s)
        if self.gen.broken:
            raise RuntimeError("the device is gone")
        self.gen.rounds += 1
        events = []
        for h in list(self.active):
            n = len(h.new_tokens)
            token = ord(chr(h.prompt[n % len(h.prompt)]).upper())
            h.new_tokens.append(token)
            h.records.append(_record(n % 3, 1, n))
            if len(h.new_tokens) >= h.max_new_tokens:
                self.active.remove(h)
                h.done = True
                stats = summarize(h.records, len(h.new_tokens), 0.01, "max_new_tokens")
                h.result = GenerationResult(h.new_tokens, _chars(h.new_tokens), stats, h.records, prompt_ids=h.prompt)
            events.append((h, [token]))
        return events

    def cancel(self, handle):
        self.active.remove(handle)
        self.gen.cancelled += 1


class FakeGenerator:
    def __init__(self, round_s: float) -> None:
        self.tokenizer = FakeTokenizer()
        self.max_context = 64
        self.arms = [type("Arm", (), {"name": n})() for n in ("a", "b", "c")]
        self.policy = make_policy("ucb", ["a", "b", "c"], np.random.default_rng(0))
        self.round_s = round_s
        self.rounds = 0
        self.cancelled = 0
        self.broken = False

    def encode(self, ids):
        return list(ids)

    def batch_session(self, max_batch: int) -> FakeSession:
        return FakeSession(self, max_batch)


class FakeServer:
    """The app over a fake generator, served by uvicorn on a thread (as the CLI does, without the models)."""

    def __init__(self, round_s: float = 0.02, max_batch: int = 2, queue_size: int = 2,
                 settings: Any = None) -> None:
        import uvicorn

        from draftwise.serve.app import ServeSettings, Service, create_app
        from draftwise.serve.metrics import ServeMetrics
        from draftwise.serve.scheduler import Scheduler

        self.gen = FakeGenerator(round_s)
        metrics = ServeMetrics(["a", "b", "c"], "ucb")
        self.scheduler = Scheduler(self.gen, max_batch=max_batch, queue_size=queue_size,
                                   on_result=metrics.observe, on_cancel=metrics.cancelled.inc)
        self.service = Service(self.gen, self.scheduler, metrics, model=MODEL, policy="ucb",
                               settings=settings or ServeSettings())
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(create_app(self.service), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        for _ in range(200):
            if self.server.started:
                break
            time.sleep(0.01)

    def post(self, path: str, body: dict[str, Any] | bytes, timeout: float = 10,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                         headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def get(self, path: str, timeout: float = 10) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def fake_server():
    server = FakeServer()
    yield server
    server.stop()


def test_fake_app_answers_streams_and_errors(fake_server):
    status, _, body = fake_server.post("/v1/completions", {"prompt": "abc", "max_tokens": 5})
    reply = json.loads(body)
    assert status == 200 and reply["choices"][0]["text"] == "ABCAB", reply
    assert reply["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert reply["speculative"]["rounds"] == 5 and reply["speculative"]["pulls"] == {"0": 2, "1": 2, "2": 1}
    status, headers, body = fake_server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "xy"}],
                                                                      "max_tokens": 4, "stream": True})
    events = [line[len("data: "):] for line in body.decode().split("\n\n") if line]
    assert status == 200 and headers["content-type"].startswith("text/event-stream") and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "XY>X"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and not any("usage" in c for c in chunks)
    status, _, body = fake_server.post("/v1/completions", {"prompt": "xy", "max_tokens": 4, "stream": True,
                                                           "stream_options": {"include_usage": True}})
    chunks = [json.loads(line[len("data: "):]) for line in body.decode().split("\n\n")[:-2] if line]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and "usage" not in chunks[-2]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    status, _, body = fake_server.post("/v1/completions", b"{oops")
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_json"
    status, _, body = fake_server.post("/v1/completions", {"prompt": "a" * 60, "max_tokens": 10})
    assert status == 400 and json.loads(body)["error"]["code"] == "context_length_exceeded"


def test_a_full_queue_answers_503_with_retry_after_and_never_hangs(fake_server):
    fake_server.gen.round_s = 0.05
    results: list[int] = []

    def one(i: int) -> None:
        results.append(fake_server.post("/v1/completions", {"prompt": f"p{i}", "max_tokens": 8}, timeout=30)[0])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    status, headers, body = fake_server.post("/v1/completions", {"prompt": "late", "max_tokens": 2})
    assert status == 503 and headers["retry-after"] == "1", body
    assert json.loads(body)["error"]["code"] == "queue_full"
    message = json.loads(body)["error"]["message"]
    assert "running (--max-batch 2) and 2 waiting (--queue-size 2)" in message, message
    for t in threads:
        t.join(30)
    assert sorted(set(results)) == [200, 503] and results.count(200) >= 4  # batch 2 + queue 2, then 503s


def test_a_full_queue_counts_no_more_waiting_than_the_queue_holds():
    """Requests queued while the worker runs a round, with room in the batch, join it at the next round: they are
    counted as running, so a refusal never reports more waiting than --queue-size."""
    from draftwise.serve.scheduler import Job, Overloaded, Scheduler

    scheduler = Scheduler(FakeGenerator(0.0), max_batch=2, queue_size=2)  # not started: nothing is admitted
    for i in range(4):
        scheduler.submit(Job([i + 1], Request(max_new_tokens=1)))
    with pytest.raises(Overloaded) as caught:
        scheduler.submit(Job([9], Request(max_new_tokens=1)))
    assert str(caught.value) == "2 requests are running (--max-batch 2) and 2 waiting (--queue-size 2)"


def test_the_context_error_names_the_length_field_the_client_sent(fake_server):
    messages = [{"role": "user", "content": "hello"}]
    for field in ("max_tokens", "max_completion_tokens"):
        status, _, body = fake_server.post("/v1/chat/completions", {"messages": messages, field: 100})
        error = json.loads(body)["error"]
        assert status == 400 and error["code"] == "context_length_exceeded", error
        assert error["param"] == field and f"{field} asks for 100 more" in error["message"], error
    status, _, body = fake_server.post("/v1/completions", {"prompt": "hello", "max_tokens": 100})
    assert json.loads(body)["error"]["param"] == "max_tokens"


def test_a_nul_character_in_a_prompt_is_refused(fake_server):
    status, _, body = fake_server.post("/v1/completions", {"prompt": "Hel\u0000lo", "max_tokens": 2})
    error = json.loads(body)["error"]
    assert status == 400 and error["param"] == "prompt", error
    assert "the prompt contains a NUL character (\\x00) at position 3" in error["message"], error


def test_a_client_that_goes_away_stops_its_generation_within_a_round(fake_server):
    fake_server.gen.round_s = 0.05
    sock = socket.create_connection(("127.0.0.1", fake_server.port))
    body = json.dumps({"prompt": "abc", "max_tokens": 60, "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    received = b""
    while b"data: " not in received:
        received += sock.recv(4096)
    sock.close()
    deadline = time.time() + 5
    while fake_server.gen.cancelled == 0 and time.time() < deadline:
        time.sleep(0.01)
    assert fake_server.gen.cancelled == 1
    rounds = fake_server.gen.rounds
    time.sleep(0.2)
    assert fake_server.gen.rounds == rounds  # nothing runs any more
    status, _, reply = fake_server.post("/v1/completions", {"prompt": "abc", "max_tokens": 3})
    assert status == 200 and json.loads(reply)["choices"][0]["text"] == "ABC"


def test_shutdown_finishes_requests_in_flight():
    server = FakeServer(round_s=0.02, max_batch=1, queue_size=4)
    replies: list[Any] = []
    threads = [threading.Thread(target=lambda: replies.append(server.post("/v1/completions",
                                                                          {"prompt": "zz", "max_tokens": 10})))
               for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    server.stop()  # what SIGTERM does: uvicorn stops accepting, lets open requests finish, then the lifespan ends
    for t in threads:
        t.join(10)
    assert [r[0] for r in replies] == [200, 200, 200]
    assert all(json.loads(r[2])["choices"][0]["text"] == "ZZZZZZZZZZ" for r in replies)
    assert not server.thread.is_alive() and not server.scheduler._thread.is_alive()


def test_the_ticket_delivers_across_threads():
    from draftwise.serve.scheduler import Done, Job, Ticket, Tokens

    async def go() -> list[Any]:
        ticket = Ticket(Job([1], Request(1)), scheduler=None)  # type: ignore[arg-type]
        threading.Thread(target=lambda: (ticket.job.deliver(Tokens([5])), ticket.job.deliver(Done(None)))).start()
        return [await ticket.next(), await ticket.next()]

    first, second = asyncio.run(go())
    assert first == Tokens([5]) and isinstance(second, Done)


# ----------------------------------------------------------------------------- limits, readiness, access
def test_the_body_limit_refuses_at_once_by_declared_size_and_by_bytes_received():
    from draftwise.serve.app import ServeSettings

    server = FakeServer(settings=ServeSettings(max_body_bytes=1000))
    try:
        status, _, body = server.post("/v1/completions", {"prompt": "a" * 2000})
        assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
        # declared larger than the limit: answered before a byte of the body is sent
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 20000000\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 413")
        sock.close()
        # no declared size (chunked): refused once the bytes received pass the limit
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n" + b"400\r\n" + b"x" * 1024 + b"\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 413")
        sock.close()
        assert server.post("/v1/completions", {"prompt": "ab", "max_tokens": 2})[0] == 200
    finally:
        server.stop()


def test_tokenizing_runs_off_the_event_loop(fake_server):
    replies: list[int] = []
    thread = threading.Thread(target=lambda: replies.append(
        fake_server.post("/v1/completions", {"prompt": "slow prompt", "max_tokens": 2})[0]))
    thread.start()
    time.sleep(0.2)  # the tokenizer is busy for a second
    start = time.perf_counter()
    assert fake_server.get("/health")[0] == 200
    assert time.perf_counter() - start < 0.5
    thread.join(10)
    assert replies == [200]


def test_health_is_503_while_generation_fails_and_ok_once_it_works_again(fake_server):
    fake_server.gen.broken = True
    status, _, body = fake_server.post("/v1/completions", {"prompt": "ab", "max_tokens": 2})
    assert status == 500 and "the device is gone" in json.loads(body)["error"]["message"]
    status, body = fake_server.get("/health")
    assert status == 503 and "generation is failing: RuntimeError: the device is gone" in json.loads(body)["error"]
    generated = fake_server.service.metrics.generation_tokens._value.get()
    fake_server.gen.broken = False
    assert fake_server.get("/health") == (200, b'{"status":"ok"}')  # its own one-token check worked
    assert fake_server.service.metrics.generation_tokens._value.get() == generated  # the check is no request
    assert fake_server.post("/v1/completions", {"prompt": "ab", "max_tokens": 2})[0] == 200


def test_usage_counts_the_tokens_of_the_text_returned():
    from draftwise.serve.protocol import completion_tokens

    def decode(ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)

    ids = [ord(c) for c in "def f(x): return x"]
    assert completion_tokens(ids, "def f", decode) == 5
    assert completion_tokens(ids, "", decode) == 0
    assert completion_tokens(ids, "def f(x): return x", decode) == len(ids)
    pairs = [ord("a"), 0x100, ord("b")]  # a token whose text holds the stop's start is part of the text

    def decode_pairs(ids: list[int]) -> str:
        return "".join("(c" if i == 0x100 else chr(i) for i in ids)

    assert completion_tokens(pairs, "a(", decode_pairs) == 2


@pytest.mark.parametrize("body, words", [
    ({"prompt": "hi", "stream_options": {"include_usage": True}}, "only allowed when stream is true"),
    ({"prompt": "hi", "stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options must be"),
    ({"prompt": "hi", "stream": True, "stream_options": {"continuous_usage_stats": True}},
     "continuous_usage_stats is not supported"),
])
def test_stream_options_are_checked(body, words):
    error = _error(parse_completion, body, MODEL)
    assert error.param == "stream_options" and words in error.message, error.message


def test_a_post_body_must_be_declared_json(fake_server):
    from draftwise.serve.protocol import check_content_type

    check_content_type("application/json; charset=utf-8")
    for value in (None, "text/plain", "application/x-www-form-urlencoded"):
        assert _error(check_content_type, value).status == 415
    status, _, body = fake_server.post("/v1/completions", {"prompt": "ab"}, headers={"Content-Type": "text/plain"})
    assert status == 415 and "Content-Type: application/json" in json.loads(body)["error"]["message"]


@pytest.mark.parametrize("host, bound, allowed, ok", [
    ("localhost:8000", "127.0.0.1", (), True),
    ("127.0.0.1:8000", "127.0.0.1", (), True),
    ("[::1]:8000", "127.0.0.1", (), True),
    ("app.localhost", "127.0.0.1", (), True),
    ("attacker.example", "127.0.0.1", (), False),
    ("attacker.example:8000", "127.0.0.1", ("attacker.example",), True),
    ("anything.example", "127.0.0.1", ("*",), True),
    ("10.0.0.5:8000", "127.0.0.1", (), False),
    ("10.0.0.5:8000", "0.0.0.0", (), True),
    ("10.0.0.5:8000", "10.0.0.5", (), True),
    ("my-box.lan", "0.0.0.0", (), False),
    ("", "127.0.0.1", (), False),
])
def test_host_headers_accepted_by_default_and_by_option(host, bound, allowed, ok):
    from draftwise.serve.security import Access, host_allowed, host_name

    assert host_allowed(host_name(host), Access(bound_host=bound, allowed_hosts=allowed)) is ok


def test_origins_and_bearer_tokens():
    from draftwise.serve.security import Access, bearer_matches, origin_allowed

    assert origin_allowed("http://127.0.0.1:8000", Access())
    assert not origin_allowed("https://evil.example", Access())
    assert not origin_allowed("null", Access())
    assert origin_allowed("https://app.example", Access(cors_origins=("https://app.example",)))
    assert bearer_matches("Bearer s3cret", "s3cret") and bearer_matches("bearer  s3cret ", "s3cret")
    assert not bearer_matches("Bearer s3cre", "s3cret") and not bearer_matches(None, "s3cret")
    assert not bearer_matches("Basic s3cret", "s3cret")


def test_the_guard_answers_foreign_hosts_origins_and_missing_keys():
    from draftwise.serve.app import ServeSettings
    from draftwise.serve.security import Access

    server = FakeServer(settings=ServeSettings(access=Access(api_key="k3y")))
    try:
        def call(method: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
            data = json.dumps({"prompt": "ab", "max_tokens": 2}).encode() if method == "POST" else None
            request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", data=data, method=method,
                                             headers={"Content-Type": "application/json", **headers})
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return response.status, json.loads(response.read())
            except urllib.error.HTTPError as error:
                return error.code, json.loads(error.read())

        key = {"Authorization": "Bearer k3y"}
        status, body = call("POST", "/v1/completions", {**key, "Host": "attacker.example"})
        assert status == 400 and body["error"]["code"] == "invalid_host"
        status, body = call("POST", "/v1/completions", {**key, "Origin": "https://evil.example"})
        assert status == 403 and "--cors-origin https://evil.example" in body["error"]["message"]
        for path in ("/v1/completions", "/v1/models", "/v1/learner"):
            status, body = call("POST" if path == "/v1/completions" else "GET", path, {})
            assert status == 401 and body["error"]["code"] == "invalid_api_key", (path, body)
        assert call("GET", "/v1/models", {"Authorization": "Bearer nope"})[0] == 401
        assert call("POST", "/v1/completions", key)[0] == 200
        assert call("GET", "/health", {})[0] == 200 and server.get("/metrics")[0] == 200
    finally:
        server.stop()


@pytest.mark.parametrize("argv, words", [
    (["--api-key", ""], "--api-key must be a non-empty key without spaces"),
    (["--api-key", "two words"], "--api-key must be a non-empty key without spaces"),
    (["--cors-origin", "evil.example"], "--cors-origin 'evil.example' is not an origin"),
    (["--max-body-mb", "0"], "--max-body-mb must be > 0"),
])
def test_serve_refuses_access_options_that_cannot_work_before_loading(monkeypatch, capsys, argv, words):
    import draftwise.api
    from draftwise.cli import main

    monkeypatch.setattr(draftwise.api.Generator, "from_pretrained", lambda *a, **k: pytest.fail("models loaded"))
    assert main(["serve", "--port", "0", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err
