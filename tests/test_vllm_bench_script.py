"""The vLLM throughput benchmark's own logic (no vLLM needed): method variants and the summary
over repeats."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "vllm_throughput.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("vllm_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_variant_adds_its_options_and_may_set_k(bench) -> None:
    variants = bench.variants(['nocap={"cap_acceptance": 0}', 'k16={"k": 16, "policy": "ucb"}'])
    spec, config = bench.spec_config("draftwise+k16", 8, '{"log_requests": false}', variants)
    assert spec["num_speculative_tokens"] == 16
    assert json.loads(config) == {"log_requests": False, "policy": "ucb"}
    spec, config = bench.spec_config("draftwise+nocap", 8, "", variants)
    assert spec["num_speculative_tokens"] == 8 and json.loads(config) == {"cap_acceptance": 0}
    assert bench.spec_config("draftwise", 8, "", variants)[1] == "{}"


def test_bad_variants_are_refused_clearly(bench) -> None:
    with pytest.raises(SystemExit, match="no --variant fast"):
        bench.spec_config("draftwise+fast", 8, "", {})
    with pytest.raises(SystemExit, match="LABEL=JSON"):
        bench.variants(["nocap"])


def _run(rates: dict[int, float], outputs: list[list[int]]) -> dict:
    return {"levels": {str(c): {"tokens_per_s": r, "outputs": outputs} for c, r in rates.items()}}


def test_summary_gives_ratios_to_none_of_the_same_repeat(bench) -> None:
    same, other = [[1, 2]], [[1, 3]]
    repeats = [
        {"none": _run({1: 100.0}, same), "ngram:4": _run({1: 150.0}, same), "draftwise": _run({1: 200.0}, other)},
        {"none": _run({1: 200.0}, same), "ngram:4": _run({1: 250.0}, same), "draftwise": _run({1: 300.0}, other)},
    ]
    lines = bench.summary(repeats, [1]).splitlines()
    assert lines[2].startswith("| none | 150 (1.00× ± 0.00)")
    assert "| ngram:4 | 200 (1.38× ± 0.18) | yes |" in lines  # 1.5 and 1.25: mean 1.375, std 0.177
    assert lines[-1].endswith("| NO |")  # outputs that differ from none's are flagged


def test_interleaved_chunks_rotate_the_methods_and_need_one_process(bench, monkeypatch) -> None:
    methods = ["none", "ngram:4", "draftwise"]
    firsts = [bench.rotated(methods, chunk)[0] for chunk in range(6)]
    assert firsts == methods * 2 and sorted(bench.rotated(methods, 4)) == sorted(methods)
    monkeypatch.setattr("sys.argv", ["vllm_throughput.py", "--interleaved", "--methods", "none"])
    with pytest.raises(SystemExit) as exited:
        bench.main()
    assert exited.value.code == 2  # argparse's usage error: nothing started
