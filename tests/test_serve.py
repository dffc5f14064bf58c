"""``draftwise serve`` as a real process on 127.0.0.1 with the embedded zoo, driven by the official ``openai``
client: greedy text equals ``Generator.generate``'s, streamed or not; usage (stop strings cut); 50 concurrent
clients; a client that disconnects; every bad request; vanishing temperatures; the body limit, /health during a
large request and the memory after it; Host, Origin and Content-Type; seeds; ``/metrics`` against the
responses; the live page; SIGTERM and --state. A second process checks the API key, a fixed --seed and
/health while generation fails.

One server process for the module (its tests run in file order: the last one stops it)."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

MODEL = "zoo:target"
PROMPT = "Write a Python function that returns the square of a number."
# the default's arms on the toy zoo's pool: the lookups' pick at two lengths, the zoo's generalist, none
DEFAULT_ARMS = ["suffix/pld@8", "suffix/pld@3", "generalist@3+max-confidence:h=0.3", "none"]
STARTUP_S = 180


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    broken: Path  # the launcher's switch: rounds fail while this file exists

    def __init__(self, tmp: Path, *extra: str, env: dict[str, str] | None = None, api_key: str = "none",
                 launcher: list[str] | None = None) -> None:
        self.port = _free_port()
        self.state = tmp / "learner.json"
        self.log = open(tmp / f"server-{self.port}.log", "w+b")  # noqa: SIM115 (closed in stop)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, *(launcher or ["-m", "draftwise.cli"]), "serve", "--target", "zoo:target",
             "--port", str(self.port), "--threads", "1", "--state", str(self.state), "--max-batch", "16",
             "--queue-size", "64", *extra],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + STARTUP_S
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if self.get("/health")[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        else:
            self.stop()
            raise RuntimeError(f"the server did not answer /health within {STARTUP_S} s:\n{self.output()}")
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=120)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def post(self, path: str, data: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(self.url + path, data=data,
                                         headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = self.get("/metrics")[1].decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    process = ServerProcess(tmp_path_factory.mktemp("serve"))
    yield process
    process.stop()


@pytest.fixture(scope="module")
def gen():
    """The library on the same prompts (its output is the target's own greedy decoding)."""
    from draftwise import Generator

    return Generator.from_pretrained("zoo:target", drafters=["pld"])


def _ids(gen, text: str) -> list[int]:
    return [int(i) for i in gen.tokenizer(text, add_special_tokens=True)["input_ids"]]


def _total(metrics: dict, name: str) -> float:
    return sum(v for (n, _), v in metrics.items() if n == name)


# ----------------------------------------------------------------------------- exact text, usage
def test_models_lists_the_served_model(server):
    models = server.client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_greedy_streamed_equals_non_streamed_equals_generate(server, gen):
    reference = gen.generate(PROMPT, max_new_tokens=24)  # chat template, as `draftwise generate PROMPT`
    messages = [{"role": "user", "content": PROMPT}]
    reply = server.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
    assert reply.choices[0].message.content == reference.text
    assert reply.usage.prompt_tokens == len(gen.encode(PROMPT))
    assert reply.usage.completion_tokens == len(reference.token_ids)
    assert reply.choices[0].finish_reason == ("length" if reference.stats.stopped_by == "max_new_tokens" else "stop")
    spec = reply.model_extra["speculative"]
    # whether drafting pays here is the machine's call (priced decisions): the statistics add up either way
    assert sum(spec["pulls"].values()) == spec["rounds"] and spec["mat"] >= 1.0

    chunks = list(server.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24,
                                                        temperature=0, stream=True,
                                                        stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reference.text
    finish, last = chunks[-2], chunks[-1]
    assert finish.choices[0].finish_reason == reply.choices[0].finish_reason
    assert finish.model_extra["speculative"]["rounds"] >= 1
    assert last.choices == [] and last.usage.completion_tokens == len(reference.token_ids)


def test_completion_greedy_streamed_equals_non_streamed_equals_generate(server, gen):
    prompt = "def fibonacci(n):"
    reference = gen.generate(_ids(gen, prompt), max_new_tokens=20)  # raw text, no chat template
    reply = server.client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0)
    assert reply.choices[0].text == reference.text
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(_ids(gen, prompt)),
                                                                         len(reference.token_ids))
    chunks = list(server.client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0,
                                                   stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == reference.text
    assert chunks[-1].usage.total_tokens == reply.usage.total_tokens
    plain = list(server.client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0,
                                                  stream=True))
    assert all(c.choices and c.usage is None for c in plain)  # no include_usage: no usage
    assert "".join(c.choices[0].text for c in plain) == reference.text


# ----------------------------------------------------------------------------- concurrency
def test_fifty_concurrent_clients_are_each_answered_once_with_their_text(server, gen):
    prompts = [f"def add_{i}(x):\n    return x + {i}\n\ndef times_{i}(x):" for i in range(50)]
    references = [gen.generate(_ids(gen, p), max_new_tokens=5).text for p in prompts]
    answered: list[int] = []
    lock = threading.Lock()

    def ask(i: int) -> tuple[int, str, str]:
        reply = server.client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=5, temperature=0)
        with lock:
            answered.append(i)
        return i, reply.id, reply.choices[0].text

    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(ask, range(50)))
    assert sorted(answered) == list(range(50))
    assert len({reply_id for _, reply_id, _ in results}) == 50
    wrong = [(i, text, references[i]) for i, _, text in results if text != references[i]]
    assert not wrong, wrong[:3]


def test_a_client_that_disconnects_mid_stream_is_cancelled_and_the_next_output_is_unchanged(server, gen):
    before = _total(server.metrics(), "draftwise:requests_cancelled_total")
    stream = server.client.completions.create(model=MODEL, prompt="def long_function(a, b, c):", max_tokens=400,
                                              temperature=0, stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()
    deadline = time.time() + 20
    while _total(server.metrics(), "draftwise:requests_cancelled_total") == before and time.time() < deadline:
        time.sleep(0.1)
    assert _total(server.metrics(), "draftwise:requests_cancelled_total") == before + 1
    assert _total(server.metrics(), "draftwise:num_requests_running") == 0
    reference = gen.generate(PROMPT, max_new_tokens=24)
    reply = server.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                                                  max_tokens=24, temperature=0)
    assert reply.choices[0].message.content == reference.text


# ----------------------------------------------------------------------------- bad requests
@pytest.mark.parametrize("kwargs, status, param, words", [
    ({"max_tokens": 0}, 400, "max_tokens", "max_tokens must be a positive integer"),
    ({"max_tokens": 100000}, 400, "max_tokens", "this model's context is 1024 tokens"),
    ({"temperature": -1}, 400, "temperature", "temperature must be a number in [0, 2] (0 = greedy), got -1"),
    ({"temperature": 3}, 400, "temperature", "temperature must be a number in [0, 2] (0 = greedy), got 3"),
    ({"stop": ""}, 400, "stop", "stop must be a non-empty string"),
    ({"prompt": "Hel\x00lo"}, 400, "prompt", "the prompt contains a NUL character (\\x00) at position 3"),
    ({"prompt": [1.5, 2.0]}, 400, "prompt", "prompt must be a non-empty string or a non-empty list of token ids"),
    ({"prompt": [True, 2]}, 400, "prompt", "prompt must be a non-empty string or a non-empty list of token ids"),
    ({"top_p": 0}, 400, "top_p", "top_p must lie in (0, 1]"),
    ({"top_p": 1.5}, 400, "top_p", "top_p must lie in (0, 1]"),
    ({"model": "gpt-4o"}, 404, "model", "does not exist; this server serves 'zoo:target'"),
    ({"n": 2}, 400, "n", "n=2 is not supported"),
    ({"extra_body": {"best_of": 3}}, 400, "best_of", "best_of=3 is not supported"),
    ({"extra_body": {"mirostat": 1}}, 400, "mirostat", "unrecognized request field 'mirostat'"),
])
def test_bad_requests_get_openai_shaped_errors(server, kwargs, status, param, words):
    args = {"model": MODEL, "prompt": "hello", "max_tokens": 4, **kwargs}
    with pytest.raises(openai.APIStatusError) as caught:
        server.client.completions.create(**args)
    error = caught.value
    assert error.status_code == status, error
    body = error.body if isinstance(error.body, dict) else {}
    assert body.get("param") == param and words in body.get("message", ""), body
    assert set(body) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("path, data, param, words", [
    ("/v1/completions", b'{"model": "zoo:target", "prompt": ', None, "not valid JSON"),
    ("/v1/completions", b'{"model": "zoo:target"}', "prompt", "missing required field 'prompt'"),
    ("/v1/chat/completions", b'{"model": "zoo:target"}', "messages", "missing required field 'messages'"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": -0.5}',
     "temperature", "temperature must be a number in [0, 2]"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\u0000b"}]}', "messages",
     "messages[0].content contains a NUL character"),
])
def test_malformed_and_incomplete_bodies(server, path, data, param, words):
    status, body = server.post(path, data)
    assert status == 400 and body["error"]["param"] == param and words in body["error"]["message"], body


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_chat_over_the_context_names_the_length_field_the_client_sent(server, field):
    with pytest.raises(openai.BadRequestError) as caught:
        server.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}],
                                              temperature=0, **{field: 100000})
    body = caught.value.body if isinstance(caught.value.body, dict) else {}
    assert body.get("param") == field and body.get("code") == "context_length_exceeded", body
    assert f"{field} asks for 100000 more" in body.get("message", ""), body


def test_the_top_of_openai_temperature_range_is_served(server):
    reply = server.client.completions.create(model=MODEL, prompt="hello", max_tokens=2, temperature=2, seed=1)
    assert reply.choices[0].finish_reason in ("length", "stop")


# ----------------------------------------------------------------------------- metrics and the page
def test_metrics_count_what_the_responses_reported(server):
    before = server.metrics()
    replies = [server.client.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=0)
               for p in ("import numpy as np\n", "The capital of France is")]
    after = server.metrics()

    def delta(name: str) -> float:
        return _total(after, name) - _total(before, name)

    specs = [r.model_extra["speculative"] for r in replies]
    assert delta("draftwise:rounds_total") == sum(s["rounds"] for s in specs)
    assert delta("draftwise:arm_pulls_total") == sum(s["rounds"] for s in specs)
    assert delta("draftwise:spec_decode_num_draft_tokens_total") == sum(s["drafted"] for s in specs)
    assert delta("draftwise:spec_decode_num_accepted_tokens_total") == sum(s["accepted"] for s in specs)
    assert delta("draftwise:spec_decode_num_accepted_tokens_per_pos_total") == sum(s["accepted"] for s in specs)
    assert 0 < delta("draftwise:spec_decode_num_drafts_total") <= sum(s["rounds"] for s in specs)
    assert delta("draftwise:generation_tokens_total") == sum(r.usage.completion_tokens for r in replies)
    assert delta("draftwise:prompt_tokens_total") == sum(r.usage.prompt_tokens for r in replies)
    assert delta("draftwise:request_success_total") == 2
    values = {dict(labels)["arm"] for (name, labels) in after if name == "draftwise:arm_value"}
    assert values == set(DEFAULT_ARMS)
    assert _total(after, "draftwise:evaluation_seconds_total") >= 0


def test_live_page_and_the_json_it_polls(server, tmp_path):
    status, page = server.get("/")
    assert status == 200 and b"/v1/learner" in page
    learner = json.loads(server.get("/v1/learner")[1])
    assert [a["name"] for a in learner["arms"]] == DEFAULT_ARMS
    assert sum(a["pulls"] for a in learner["arms"]) == learner["rounds"] == _total(server.metrics(),
                                                                                    "draftwise:rounds_total")
    assert learner["state"]["arms"] == DEFAULT_ARMS
    browser = shutil.which("chromium-headless-shell") or shutil.which("chromium")
    if browser is None:
        pytest.skip("no headless Chromium here: the page was fetched, not rendered")
    shot = tmp_path / "page.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1000,420", "--virtual-time-budget=3000", server.url + "/"],
                   capture_output=True, timeout=60, check=False)
    assert shot.exists() and shot.stat().st_size > 5000  # a rendered table, not a blank page


# ----------------------------------------------------------------------------- sampling settings
VANISHING = [1e-300, 1e-45, 1e-30, math.ulp(0.0)]  # float32's smallest subnormal, the smallest double


@pytest.mark.parametrize("value", VANISHING)
def test_a_vanishing_temperature_or_top_p_answers_the_greedy_text(server, gen, value):
    prompt = "def square(x):"
    greedy = gen.generate(_ids(gen, prompt), max_new_tokens=8).text
    assert greedy.strip()
    for options in ({"temperature": value}, {"temperature": 0.7, "top_p": value}):
        reply = server.client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, **options)
        assert reply.choices[0].text == greedy, options


def test_usage_counts_the_returned_text_cut_at_the_stop_string_the_same_every_time(server, gen):
    prompt = "def square(x):"
    reference = gen.generate(_ids(gen, prompt), max_new_tokens=40, stop=["("])
    text = reference.text[: reference.text.index("(")]
    ids = reference.token_ids
    tokens = next(k for k in range(len(ids) + 1)
                  if gen.tokenizer.decode(ids[:k], skip_special_tokens=True).startswith(text))
    assert tokens < len(reference.token_ids)  # the token that completed the stop string is not counted
    counts = set()
    for _ in range(4):
        reply = server.client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0, stop="(")
        assert reply.choices[0].text == text and reply.choices[0].finish_reason == "stop"
        counts.add(reply.usage.completion_tokens)
    chunks = list(server.client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0,
                                                   stop="(", stream=True, stream_options={"include_usage": True}))
    counts.add(chunks[-1].usage.completion_tokens)
    assert counts == {tokens}


def test_requests_without_a_seed_draw_a_fresh_one_and_return_it(server):
    def ask(**options: Any) -> tuple[str, int]:
        reply = server.client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16,
                                                 temperature=1.0, **options)
        return reply.choices[0].text, reply.model_extra["seed"]

    draws = [ask() for _ in range(3)]
    assert len({seed for _, seed in draws}) == 3 and all(0 <= seed < 2**53 for _, seed in draws)
    assert len({text for text, _ in draws}) > 1
    text, seed = draws[0]
    assert ask(seed=seed) == (text, seed)  # the returned seed gives the text again


# ----------------------------------------------------------------------------- large bodies
def test_a_body_over_the_limit_is_refused_at_once(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        start = time.perf_counter()
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                     "Content-Type: application/json\r\nContent-Length: 20000000\r\n\r\n".encode())
        head = sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 413") and time.perf_counter() - start < 2, head
    body = b"x" * 6_000_000  # sent whole before the answer is read, as HTTP clients do
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        assert sock.recv(4096).startswith(b"HTTP/1.1 413")
    with pytest.raises(openai.APIStatusError) as caught:
        server.client.completions.create(model=MODEL, prompt="x " * 3_000_000, max_tokens=2)
    assert caught.value.status_code == 413 and "over this server's limit of 4194304 bytes" in str(caught.value)


def test_health_answers_while_a_large_prompt_is_tokenized_and_the_memory_comes_back(server):
    before = server.rss_mb()
    outcome: list[tuple[int, dict[str, Any]]] = []
    prompt = "def f(x):\n    return x\n" * 150_000  # 3.6 MB: about 1.4 million tokens to find it too long
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 4}).encode()
    thread = threading.Thread(target=lambda: outcome.append(server.post("/v1/completions", body)))
    thread.start()
    latencies = []
    while thread.is_alive():
        start = time.perf_counter()
        assert server.get("/health")[0] == 200
        latencies.append(time.perf_counter() - start)
        time.sleep(0.05)
    thread.join()
    status, reply = outcome[0]
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded"
    assert len(latencies) >= 5 and max(latencies) < 1.0, latencies
    deadline = time.time() + 10
    while server.rss_mb() > before + 150 and time.time() < deadline:
        time.sleep(0.2)
    assert server.rss_mb() < before + 150, (before, server.rss_mb())


# ----------------------------------------------------------------------------- hosts, origins, content types
def test_foreign_hosts_and_pages_of_other_sites_are_refused(server):
    data = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 2}).encode()
    status, body = server.post("/v1/completions", data, headers={"Host": "attacker.example"})
    assert status == 400 and body["error"]["code"] == "invalid_host", body
    status, body = server.post("/v1/completions", data, headers={"Content-Type": "text/plain",
                                                                 "Origin": "https://attacker.example"})
    assert status == 403 and body["error"]["code"] == "origin_not_allowed", body
    status, body = server.post("/v1/completions", data, headers={"Content-Type": "text/plain"})
    assert status == 415 and "application/json" in body["error"]["message"], body
    status, _ = server.get("/v1/models", headers={"Origin": "https://attacker.example"})
    assert status == 403
    status, _ = server.post("/v1/completions", data, headers={"Host": f"localhost:{server.port}",
                                                              "Origin": f"http://localhost:{server.port}"})
    assert status == 200
    preflight = urllib.request.Request(server.url + "/v1/completions", method="OPTIONS", headers={
        "Origin": f"http://localhost:{server.port}", "Access-Control-Request-Method": "POST"})
    try:
        urllib.request.urlopen(preflight, timeout=10)
    except urllib.error.HTTPError as error:
        assert "access-control-allow-origin" not in {k.lower() for k in error.headers}  # CORS is off


# ----------------------------------------------------------------------------- an API key, a fixed seed, readiness
LAUNCHER = '''
"""draftwise serve whose rounds fail while the file named by $DRAFTWISE_BREAK exists."""
import os
import sys
from pathlib import Path

import draftwise.engine.session
from draftwise.cli import main

switch = Path(os.environ["DRAFTWISE_BREAK"])
step = draftwise.engine.session.BatchSession.step


def breakable(self):
    if switch.exists():
        raise RuntimeError("the device is gone")
    return step(self)


draftwise.engine.session.BatchSession.step = breakable
sys.exit(main(sys.argv[1:]))
'''
KEY = "k3y-for-tests"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keyed")
    launcher = tmp / "breakable_serve.py"
    launcher.write_text(LAUNCHER)
    process = ServerProcess(tmp, "--seed", "7", launcher=[str(launcher)], api_key=KEY,
                            env={"DRAFTWISE_API_KEY": KEY, "DRAFTWISE_BREAK": str(tmp / "broken")})
    process.broken = tmp / "broken"
    yield process
    process.stop()


def test_with_an_api_key_every_v1_route_needs_it_and_health_and_metrics_do_not(keyed):
    anonymous = openai.OpenAI(base_url=keyed.url + "/v1", api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        anonymous.completions.create(model=MODEL, prompt="hello", max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        anonymous.models.list()
    for path in ("/v1/models", "/v1/learner"):
        status, body = keyed.get(path)
        assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    assert keyed.get("/health")[0] == 200 and keyed.get("/metrics")[0] == 200
    assert [m.id for m in keyed.client.models.list().data] == [MODEL]
    assert keyed.get("/v1/learner", headers={"Authorization": f"Bearer {KEY}"})[0] == 200


def test_a_fixed_seed_gives_requests_without_one_the_same_draw(keyed):
    replies = [keyed.client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=1.0)
               for _ in range(2)]
    assert [r.model_extra["seed"] for r in replies] == [7, 7]
    assert replies[0].choices[0].text == replies[1].choices[0].text


def test_health_turns_503_while_generation_fails_and_ok_once_it_works(keyed):
    keyed.broken.touch()
    try:
        with pytest.raises(openai.InternalServerError):
            keyed.client.completions.create(model=MODEL, prompt="hello", max_tokens=4, temperature=0)
        status, body = keyed.get("/health")
        assert status == 503 and "the device is gone" in json.loads(body)["error"], body
    finally:
        keyed.broken.unlink()
    assert keyed.get("/health") == (200, b'{"status":"ok"}')
    assert keyed.client.completions.create(model=MODEL, prompt="hello", max_tokens=4, temperature=0).choices


# ----------------------------------------------------------------------------- shutdown and restart (last)
def test_sigterm_finishes_the_request_in_flight_then_the_state_survives_a_restart(server, tmp_path):
    outcome: dict[str, Any] = {}

    def ask() -> None:
        try:
            outcome["reply"] = server.client.completions.create(model=MODEL, prompt="class Stack:", max_tokens=48,
                                                                temperature=0, extra_body={"ignore_eos": True})
        except Exception as error:  # the assertion below shows it
            outcome["error"] = error

    thread = threading.Thread(target=ask)
    thread.start()
    deadline = time.time() + 20
    while _total(server.metrics(), "draftwise:num_requests_running") < 1 and time.time() < deadline:
        time.sleep(0.02)
    learner = json.loads(server.get("/v1/learner")[1])
    assert learner["running"] == 1
    server.proc.send_signal(signal.SIGTERM)
    thread.join(60)
    assert "error" not in outcome, outcome
    assert outcome["reply"].usage.completion_tokens == 48
    assert server.proc.wait(30) == 0, server.output()
    saved = json.loads(server.state.read_text())
    assert saved["format"] == "draftwise-learner-state"
    assert saved["arms"] == DEFAULT_ARMS

    again = ServerProcess(server.state.parent)  # the same --state file
    try:
        restored = json.loads(again.get("/v1/learner")[1])["state"]
        assert restored["contexts"], restored
        assert restored["t"] > 0 and restored == _state_after_last_query(server.state)
    finally:
        assert again.stop() == 0


def _state_after_last_query(path: Path) -> dict[str, Any]:
    """The learner's state_dict as saved: what a fresh ctx-ucb watching the server's lookups shows once the
    file is loaded."""
    import numpy as np

    from draftwise.policies import make_policy
    from draftwise.policies.contextual import contextual_spec
    from draftwise.serve.metrics import _finite_tree
    from draftwise.serve.state import load_state

    saved = json.loads(path.read_text())
    policy = make_policy(contextual_spec(saved["policy"], ["suffix", "pld"]), saved["arms"], np.random.default_rng(0))
    assert load_state(path, policy, saved["policy"])
    return _finite_tree(json.loads(json.dumps(policy.state_dict())))
