"""vLLM's OpenAI-compatible server (``vllm serve``) with the draftwise proposer, queried with the
official ``openai`` client:
completions and chat, streaming and not, give the same texts as the same server without
speculation; vLLM's spec-decode counters move; per-request statistics reach the stats file."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import DRAFTWISE_SPEC, PROMPTS, ROOT, worker_core

openai = pytest.importorskip("openai")
MAX_TOKENS = 40


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def servers(*launches: tuple[Path, dict | None, dict | None]):
    """``vllm serve`` processes on 127.0.0.1, one per ``(log, spec, env)``, started together (each
    spends most of a minute starting up) with their model workers on cores of their own (left
    alone, every server binds core 0), stopped (SIGINT, then the process group) afterwards; yields
    their base URLs."""
    processes = [_launch(log, spec, {**(env or {}), "VLLM_CPU_OMP_THREADS_BIND": worker_core(i)})
                 for i, (log, spec, env) in enumerate(launches)]
    try:
        for (process, base), (log, _, _) in zip(processes, launches):
            _wait_healthy(process, base, log)
        yield [base for _, base in processes]
    finally:
        for process, _ in processes:
            process.send_signal(signal.SIGINT)
        for process, _ in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _launch(log: Path, spec: dict | None, env: dict) -> tuple[subprocess.Popen, str]:
    from draftwise.zoo import resolve_zoo_name

    port = free_port()
    # ``vllm serve``'s server. vllm-cpu 0.32's ``vllm`` command fails before parsing anything
    # (it asks importlib.metadata for the version of a distribution named "vllm"); the server
    # module it dispatches to runs the same server with the same options.
    command = [sys.executable, "-W", "ignore::DeprecationWarning", "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(resolve_zoo_name("zoo:target")), "--host", "127.0.0.1", "--port", str(port),
               "--dtype", "float32", "--max-model-len", "1024",
               "--enforce-eager", "--gpu-memory-utilization", "0.15", "--seed", "0", "--served-model-name", "zoo"]
    if spec:
        command += ["--speculative-config", json.dumps(spec)]
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, **env}, start_new_session=True)
    return process, f"http://127.0.0.1:{port}"


def _wait_healthy(process: subprocess.Popen, base: str, log: Path) -> None:
    deadline = time.time() + 300
    while True:
        try:
            with urllib.request.urlopen(base + "/health", timeout=2):
                return
        except OSError:
            if process.poll() is not None or time.time() > deadline:
                raise AssertionError("vllm serve did not start:\n" + log.read_text()[-4000:]) from None
            time.sleep(1)


def metrics(base: str) -> dict[str, float]:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:spec_decode_num_") and "_per_pos" not in line:
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0]] = out.get(name.split("{")[0], 0.0) + float(value)
    return out


def query(base: str) -> dict[str, list[str]]:
    """The same questions four ways: completions / chat × plain / streamed."""
    client = openai.OpenAI(base_url=base + "/v1", api_key="none")
    out: dict[str, list[str]] = {"completion": [], "completion_stream": [], "chat": [], "chat_stream": []}
    for prompt in PROMPTS[:3]:
        text = f"<|user|>\n{prompt}\n<|assistant|>\n"
        done = client.completions.create(model="zoo", prompt=text, max_tokens=MAX_TOKENS, temperature=0)
        out["completion"].append(done.choices[0].text)
        stream = client.completions.create(model="zoo", prompt=text, max_tokens=MAX_TOKENS, temperature=0, stream=True)
        out["completion_stream"].append("".join(chunk.choices[0].text for chunk in stream if chunk.choices))
        messages = [{"role": "user", "content": prompt}]
        chat = client.chat.completions.create(model="zoo", messages=messages, max_tokens=MAX_TOKENS, temperature=0)
        out["chat"].append(chat.choices[0].message.content)
        stream = client.chat.completions.create(model="zoo", messages=messages, max_tokens=MAX_TOKENS, temperature=0,
                                                stream=True)
        out["chat_stream"].append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    stats = tmp / "stats.jsonl"
    env = {"DRAFTWISE_VLLM_CONFIG": json.dumps({"stats_file": str(stats)})}
    with servers((tmp / "plain.log", None, None), (tmp / "draftwise.log", DRAFTWISE_SPEC, env)) as (plain_base, base):
        plain = query(plain_base)
        before = metrics(base)
        ours = query(base)
        after = metrics(base)
    return plain, ours, before, after, stats, tmp / "draftwise.log"


def test_texts_equal_the_server_without_speculation(served):
    plain, ours, *_ = served
    assert ours == plain
    assert all(text for texts in ours.values() for text in texts)


def test_spec_decode_counters_move(served):
    _, _, before, after, *_ = served
    for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total"):
        assert after.get(name, 0.0) > before.get(name, 0.0), (name, before, after)


def test_per_request_statistics_are_readable(served):
    *_, stats, log = served
    lines = [json.loads(line) for line in stats.read_text().splitlines()]
    assert len(lines) >= 11  # 12 requests; the last retires when the next step runs
    assert all({"request_id", "pulls", "mat", "acceptance_rate"} <= set(line) for line in lines)
    assert "draftwise request" in log.read_text()  # and the server log shows them
