"""The benchmark harness: prompt files, methods, resume, reports, mismatch detection, workers, Ray.

Tiny real models from conftest; a handful of prompts and a few new tokens each.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from draftwise.bench.datasets import load_prompt_file, load_prompt_files
from draftwise.bench.methods import EngineMethod, Output, expand_methods, register_method, split_methods
from draftwise.bench.report import SUMMARY_KEYS, summarize_rows
from draftwise.bench.router import route_table, train_router
from draftwise.bench.rows import mismatched_keys, oracle_rows
from draftwise.bench.runner import BenchConfig, read_rows, run_bench
from draftwise.cli import main
from draftwise.errors import DraftwiseError

torch.set_num_threads(1)

PROMPTS = [
    {"prompt": "the cat sat on the mat and then", "domain": "animals"},
    {"prompt": "the dog ran far and the cat sat", "domain": "animals"},
    {"prompt": "def x ( y ) : return y + 1", "domain": "code"},
    {"prompt": "for x in y : print ( x )", "domain": "code"},
]
MAX_NEW = 8


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def setup(tiny_models, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("bench")
    data = write_jsonl(root / "prompts.jsonl", PROMPTS)
    router = write_jsonl(root / "router.jsonl", [
        {"prompt": p["prompt"], "drafter": "llama-near" if p["domain"] == "code" else "pld"} for p in PROMPTS * 2])
    return {"root": root, "data": str(data), "router": str(router), "models": tiny_models}


def config(setup: dict, out: str, methods: str, **changes) -> BenchConfig:
    m = setup["models"]
    base = BenchConfig(out=str(setup["root"] / out), data=(setup["data"],), methods=tuple(split_methods(methods)),
                       target=str(m["llama-target"]), drafters=(str(m["llama-near"]), str(m["llama-small"]), "pld"),
                       max_new_tokens=MAX_NEW, warmup_tokens=2, router_train=setup["router"], progress=False)
    return replace(base, **changes)


def cli_args(cfg: BenchConfig) -> list[str]:
    args = ["bench", "--out", cfg.out, "--target", cfg.target, "--max-new-tokens", str(cfg.max_new_tokens),
            "--warmup-tokens", str(cfg.warmup_tokens), "--methods", ",".join(cfg.methods), "--quiet", "--no-plots"]
    for d in cfg.data:
        args += ["--data", d]
    for d in cfg.drafters:
        args += ["--drafter", d]
    if cfg.router_train:
        args += ["--router-train", cfg.router_train]
    return args


# ----------------------------------------------------------------------------- the full command


@pytest.fixture(scope="module")
def full_run(setup) -> tuple[BenchConfig, int]:
    cfg = config(setup, "full", "ar,default,fixed:*,random,router,oracle,hf-assisted:llama-near,"
                 "hf-assisted:llama-near,schedule=heuristic,hf-pld,ucb@2")
    args = [a for a in cli_args(cfg) if a != "--no-plots"]
    return cfg, main(args)


def test_bench_writes_every_file_with_the_summary_schema(full_run):
    cfg, code = full_run
    assert code == 0
    out = Path(cfg.out)
    for name in ("results.jsonl", "summary.json", "summary.md", "summary.csv", "env.json", "speedup_by_domain.png",
                 "best_arm_ratio.png", "arm_values.png", "cumulative_regret.png", "mat_vs_drafters.png"):
        assert (out / name).exists(), name
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"methods"}
    assert "oracle" in summary["methods"] and "fixed:pld" in summary["methods"]
    for method, entry in summary["methods"].items():
        assert set(entry) == {"overall", "by_domain"}, method
        assert set(entry["overall"]) == set(SUMMARY_KEYS)
        assert set(entry["by_domain"]) == {"animals", "code"}
        for metrics in entry["by_domain"].values():
            assert set(metrics) == set(SUMMARY_KEYS)
        assert entry["overall"]["mismatches"] == 0
    assert summary["methods"]["ar"]["overall"]["speedup"] == pytest.approx(1.0)
    assert summary["methods"]["ar"]["overall"]["mat"] == pytest.approx(1.0)
    env = json.loads((out / "env.json").read_text())
    assert {"git", "versions", "cpu", "seeds", "config"} <= set(env)
    assert env["config"]["max_new_tokens"] == MAX_NEW and env["seeds"]["run"] == 0
    rows = read_rows(out / "results.jsonl")
    methods = {r["method"] for r in rows}
    assert "oracle" not in methods  # derived in the report, never run
    assert len(rows) == len(PROMPTS) * len(methods) == len({r["key"] for r in rows})


def test_router_routes_every_prompt_by_its_training_labels(full_run):
    cfg, _ = full_run
    routed = {r["prompt_id"]: r["routed_to"] for r in read_rows(Path(cfg.out) / "results.jsonl")
              if r["method"] == "router"}
    domains = {f"prompts.jsonl:{i + 1}": p["domain"] for i, p in enumerate(PROMPTS)}
    assert routed == {pid: ("llama-near" if domains[pid] == "code" else "pld") for pid in domains}


def test_router_trains_and_routes():
    texts = ["def f(x): return x", "for i in range(3): print(i)", "select a from t where b = 1",
             "select count(*) from users", "import os\ndef g(): pass", "select name from t order by name"] * 2
    labels = ["code", "code", "sql", "sql", "code", "sql"] * 2
    router = train_router(texts, labels, seed=0)
    assert router.accuracy(texts, labels) == 1.0
    assert router.predict(["def h(y): return y * 2", "select id from orders"]) == ["code", "sql"]
    table = route_table(router.labels, ["code-drafter", "generalist", "pld"], {"code-drafter": ("code",)}, "generalist")
    assert table == {"code": "code-drafter", "sql": "generalist"}


def test_resume_after_an_interruption_never_loses_or_duplicates_a_row(setup):
    calls = {"n": 0}

    @register_method("test-interrupted", "ar, but Ctrl-C on its third run")
    def _flaky(bench, arg):
        inner = EngineMethod("test-interrupted", _plain(bench))

        class Flaky:
            name = "test-interrupted"

            def run(self, ids, text, seed, settings):
                calls["n"] += 1
                if calls["n"] == 4 and settings.max_new_tokens == MAX_NEW:  # the 3rd timed run (1 warm-up before)
                    raise KeyboardInterrupt
                return inner.run(ids, text, seed, settings)

        return Flaky()

    cfg = config(setup, "resume", "test-interrupted,fixed:pld", repeats=2)
    with pytest.raises(KeyboardInterrupt):
        run_bench(cfg)
    results = Path(cfg.out) / "results.jsonl"
    before = read_rows(results)
    assert 0 < len(before) < len(PROMPTS) * 3 * 2
    with open(results, "a") as handle:  # a row torn in the middle of its write
        handle.write(json.dumps(before[-1])[:40])
    result = run_bench(cfg)
    keys = [json.loads(line)["key"] for line in results.read_text().splitlines()]
    assert len(keys) == len(set(keys)) == len(PROMPTS) * 3 * 2  # ar, test-interrupted, fixed:pld × 2 repeats
    assert {r["key"] for r in before} <= set(keys)
    assert result.new_rows == len(keys) - len(before)
    assert run_bench(cfg).new_rows == 0  # nothing left to do


def _plain(bench):
    from draftwise.api import Generator

    return Generator(bench.model, bench.tokenizer, [], policy="fixed")


def test_a_mismatching_method_makes_the_command_exit_non_zero(setup, capsys):
    @register_method("test-wrong", "ar with its last token changed")
    def _wrong(bench, arg):
        inner = EngineMethod("test-wrong", _plain(bench))

        class Wrong:
            name = "test-wrong"

            def run(self, ids, text, seed, settings):
                out = inner.run(ids, text, seed, settings)
                return Output(out.token_ids[:-1] + [(out.token_ids[-1] + 1) % 50], out.wall_s, out.stats, out.trace)

        return Wrong()

    cfg = config(setup, "mismatch", "test-wrong,fixed:pld", data=(setup["data"],), router_train=None)
    assert main(cli_args(cfg)) == 1
    assert "differ from ar" in capsys.readouterr().err
    summary = json.loads((Path(cfg.out) / "summary.json").read_text())
    assert summary["methods"]["test-wrong"]["overall"]["mismatches"] == len(PROMPTS)
    assert summary["methods"]["fixed:pld"]["overall"]["mismatches"] == 0


def test_unknown_method_is_one_clear_error(setup, capsys):
    cfg = config(setup, "unknown", "ar,no-such-method")
    assert main(cli_args(cfg)) == 2
    err = capsys.readouterr().err
    assert "unknown method 'no-such-method'" in err and "fixed" in err and "hf-assisted" in err
    assert not (Path(cfg.out) / "results.jsonl").exists()
    with pytest.raises(DraftwiseError, match="no drafter 'nope'"):
        run_bench(config(setup, "unknown2", "fixed:nope"))


def test_a_fixed_drafter_runs_at_the_draft_length_it_names(setup):
    cfg = config(setup, "lengths", "fixed:pld@1,fixed:pld@6")
    run_bench(cfg)
    rows = read_rows(Path(cfg.out) / "results.jsonl")
    longest = {m: max(max(r["trace"]["accepted"]) for r in rows if r["method"] == m)
               for m in ("fixed:pld@1", "fixed:pld@6")}
    assert longest["fixed:pld@1"] == 1 < longest["fixed:pld@6"]  # one accepted token at most, against several
    for bad in ("fixed:pld@0", "fixed:pld@x"):
        with pytest.raises(DraftwiseError, match="draft length after @ must be an integer ≥ 1"):
            run_bench(config(setup, "bad-length", bad))


def test_workers_two_give_the_same_rows_as_one(setup):
    methods = "fixed:llama-near,ucb"
    one = run_bench(config(setup, "w1", methods))
    two = run_bench(config(setup, "w2", methods, workers=2))
    assert {r["key"]: r["token_ids"] for r in one.rows} == {r["key"]: r["token_ids"] for r in two.rows}
    assert {r["worker"] for r in two.rows} == {0, 1}


def test_ray_local_gives_the_same_rows(setup):
    pytest.importorskip("ray")
    methods = "fixed:pld"
    one = run_bench(config(setup, "r1", methods))
    on_ray = run_bench(config(setup, "r2", methods, ray="local"))
    assert {r["key"]: r["token_ids"] for r in one.rows} == {r["key"]: r["token_ids"] for r in on_ray.rows}


def test_resume_with_other_run_defining_settings_is_refused(full_run):
    cfg, _ = full_run
    with pytest.raises(DraftwiseError, match="max_new_tokens"):
        run_bench(replace(cfg, max_new_tokens=MAX_NEW + 1))


# ----------------------------------------------------------------------------- prompt files (no models)


def test_batched_summary_compares_with_one_length_fixed_in_hindsight() -> None:
    """The best fixed length is the one with the best *mean*, and each method is divided by it in
    the same repeat — not by each repeat's best length (the maximum of the lengths' noise)."""
    from draftwise.bench.batched import summarize_batched

    speeds = {"ar": [100, 100], "length:2": [150, 120], "length:4": [130, 145], "banditspec-length": [140, 138]}
    rows = [{"batch_size": 4, "method": m, "repeat": r, "tokens_per_s": v, "peak_rss_mb": 1.0}
            for m, vs in speeds.items() for r, v in enumerate(vs)]
    table = summarize_batched(rows)["4"]
    best = table["banditspec-length"]["vs_best_length"]
    assert best["length"] == "length:4"  # mean 137.5 against length:2's 135
    assert best["per_repeat"] == [pytest.approx(140 / 130, abs=1e-3), pytest.approx(138 / 145, abs=1e-3)]
    assert best["ratio"] == pytest.approx((140 / 130 + 138 / 145) / 2, abs=1e-3)
    assert "vs_best_length" not in table["length:2"] and "vs_best_length" not in table["ar"]
    assert "vs_best_length" not in summarize_batched([r for r in rows if r["method"] == "ar"])["4"]["ar"]


def test_malformed_line_reports_its_line_number(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n\n{"prompt": "broken"\n')
    with pytest.raises(DraftwiseError, match=r"bad\.jsonl, line 3"):
        load_prompt_file(path)
    path.write_text('{"prompt": "fine"}\n{"text": "no prompt field"}\n')
    with pytest.raises(DraftwiseError, match=r"line 2: no 'turns', 'prompt' or 'instruction' \+ 'instances' field"):
        load_prompt_file(path)
    assert main(["bench", "--out", str(tmp_path / "o"), "--data", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl not found" in capsys.readouterr().err


def test_mt_bench_style_input(tmp_path):
    path = write_jsonl(tmp_path / "question.jsonl", [
        {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
        {"question_id": 101, "category": "math", "turns": ["What is 2+2?"]},
    ])
    first = load_prompt_file(path)
    assert [(p.id, p.domain, p.text) for p in first] == [
        ("question.jsonl:81", "writing", "Write a poem."), ("question.jsonl:101", "math", "What is 2+2?")]
    every = load_prompt_file(path, turns="all")
    assert [p.id for p in every] == ["question.jsonl:81#1", "question.jsonl:81#2", "question.jsonl:101#1"]
    assert every[1].text == "Write a poem.\n\nNow shorter."
    assert len(load_prompt_files([path, path])) == 4  # the same file twice: ids stay unique


# ----------------------------------------------------------------------------- derived metrics (no models)


def _row(prompt: str, method: str, tokens: list[int], seconds: float, calls: int, domain: str = "d") -> dict:
    return {"key": f"{prompt}|{method}|0", "prompt_id": prompt, "domain": domain, "method": method, "repeat": 0,
            "wall_s": seconds, "new_tokens": len(tokens), "target_calls": calls, "drafted": 4, "accepted": 2,
            "token_ids": tokens, "trace": {"arm": ["a"] * calls, "emitted": [1] * calls}}


def test_oracle_speedup_and_mismatches_from_rows():
    rows = [_row("p", "ar", [1, 2, 3, 4], 4.0, 4), _row("p", "fixed:a", [1, 2, 3, 4], 1.0, 2),
            _row("p", "fixed:b", [1, 2, 3, 4], 2.0, 3), _row("p", "bad", [1, 2, 3, 5], 1.0, 2)]
    assert [r["oracle_of"] for r in oracle_rows(rows)] == ["fixed:a"]
    assert mismatched_keys(rows) == {"p|bad|0"}
    full = summarize_rows(rows, ["ar", "fixed:a", "fixed:b", "oracle", "bad"], greedy=True)
    assert full["oracle"]["overall"]["speedup"] == pytest.approx(4.0)
    assert full["fixed:b"]["overall"]["regret"] == pytest.approx(1.0)
    assert full["fixed:a"]["overall"]["best_arm_ratio"] == pytest.approx(1.0)
    assert full["bad"]["overall"]["mismatches"] == 1
    sampled = summarize_rows(rows, ["ar", "bad"], greedy=False)
    assert sampled["bad"]["overall"]["mismatches"] is None  # rejection-sampled outputs are not compared
    rows.append(_row("p", "hf-pld", [1, 2, 3, 6], 1.0, 2))
    coupled = summarize_rows(rows, ["ar", "bad", "hf-pld"], greedy=False, coupled=True)
    assert coupled["bad"]["overall"]["mismatches"] == 1  # one seed, one text: draftwise's methods must match
    assert coupled["hf-pld"]["overall"]["mismatches"] is None  # transformers samples with its own RNG


def test_method_groups_expand_against_the_pool():
    methods = expand_methods(["oracle", "hf-assisted:*", "ucb"], ["near", "pld"], ["near"])
    assert methods == ["ar", "oracle", "hf-assisted:near", "ucb", "fixed:near", "fixed:pld"]


def test_docstring_examples_of_the_bench() -> None:
    import doctest
    import importlib

    for name in ("draftwise.bench.router", "draftwise.bench.methods"):
        result = doctest.testmod(importlib.import_module(name))
        assert result.failed == 0 and result.attempted > 0, name


class _StubRay:
    """Just enough of Ray's API, run eagerly in this process, to exercise the --ray code path."""

    def __init__(self) -> None:
        self.tasks = 0

    def is_initialized(self) -> bool:
        return True

    def remote(self, **_options):
        stub = self

        def wrap(fn):
            class Task:
                @staticmethod
                def remote(*args):
                    stub.tasks += 1
                    return fn(*args)

            return Task

        return wrap

    def wait(self, pending, num_returns=1):
        return pending[:num_returns], pending[num_returns:]

    def get(self, ref):
        return ref


def test_ray_code_path_with_a_stub_and_a_clear_error_without_ray(setup, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # not installed: one clear error
    with pytest.raises(DraftwiseError, match=r"draftwise\[ray\]"):
        run_bench(config(setup, "noray", "fixed:pld", ray="auto"))
    stub = _StubRay()
    monkeypatch.setitem(sys.modules, "ray", stub)
    one = run_bench(config(setup, "stub1", "fixed:pld"))
    on_ray = run_bench(config(setup, "stub2", "fixed:pld", ray="auto"))
    assert stub.tasks == len(PROMPTS)  # one shard per prompt here (4 × workers, capped by the prompts)
    assert {r["key"]: r["token_ids"] for r in one.rows} == {r["key"]: r["token_ids"] for r in on_ray.rows}


# ----------------------------------------------------------------------------- Ctrl-C, bad input, data paths, router


def test_ctrl_c_stops_the_bench_keeps_finished_rows_and_a_rerun_resumes(setup, capsys, monkeypatch):
    """Ctrl-C mid-generation: the engine returns a result stopped by 'interrupted' (generate's way of
    keeping partial output); the bench must stop there, write no row for that run, and resume."""
    from draftwise.drafters.prompt_lookup import PromptLookupDrafter

    original = PromptLookupDrafter.propose
    calls = {"n": 0}

    def ctrl_c_on_the_twelfth_proposal(self, context, max_len, ctx, stop=None):
        calls["n"] += 1
        if calls["n"] == 12:  # inside a timed fixed:pld run after the first prompt's (≤ 2 + 8 proposals)
            raise KeyboardInterrupt
        return original(self, context, max_len, ctx, stop)

    monkeypatch.setattr(PromptLookupDrafter, "propose", ctrl_c_on_the_twelfth_proposal)
    cfg = config(setup, "ctrl-c", "fixed:pld", router_train=None)
    assert main(cli_args(cfg)) == 130
    assert "rerun the same command to resume" in capsys.readouterr().err
    results = Path(cfg.out) / "results.jsonl"
    lines = results.read_text().splitlines()
    before = [json.loads(line) for line in lines]  # every line whole
    assert 0 < len(before) < len(PROMPTS) * 2
    assert all(row["stopped_by"] != "interrupted" for row in before)
    assert calls["n"] == 12  # one Ctrl-C stopped the bench: nothing ran after it
    # a row cut short by an older version, which resumes used to keep forever: run again
    stale = dict(before[-1], key="prompts.jsonl:4|fixed:pld|0", prompt_id="prompts.jsonl:4", stopped_by="interrupted",
                 token_ids=[1])
    with open(results, "a") as handle:
        handle.write(json.dumps(stale) + "\n")
    monkeypatch.setattr(PromptLookupDrafter, "propose", original)
    assert main(cli_args(cfg)) == 0  # the greedy check passes: the cut-short run was redone
    rows = read_rows(results)
    assert len(rows) == len(PROMPTS) * 2 and {r["key"] for r in before} <= {r["key"] for r in rows}
    assert all(row["stopped_by"] != "interrupted" for row in rows)


def test_bad_data_creates_no_out_folder_and_keeps_an_existing_one(setup, capsys, tmp_path):
    out = tmp_path / "new"
    assert main(["bench", "--out", str(out), "--data", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl not found" in capsys.readouterr().err
    assert not out.exists()
    cfg = config(setup, "kept", "fixed:pld", router_train=None)
    assert main(cli_args(cfg)) == 0
    before = {p.name: p.read_bytes() for p in Path(cfg.out).iterdir()}
    assert main(cli_args(replace(cfg, drafters=("nosuchdrafter",)))) == 2  # fails after the prompts load
    capsys.readouterr()
    assert {p.name: p.read_bytes() for p in Path(cfg.out).iterdir()} == before


@pytest.mark.parametrize("extra, message", [
    (["--temperature", "nan"], "--temperature must be ≥ 0 and finite"),
    (["--temperature", "inf"], "--temperature must be ≥ 0 and finite"),
    (["--top-p", "nan"], "--top-p must lie in (0, 1], got nan"),
    (["--top-k", "0"], "--top-k must be ≥ 1, got 0"),
    (["--seed", "-1"], "--seed must be an integer in [0, 2**64), got -1"),
    (["--warmup-tokens", "-1"], "--warmup-tokens must be ≥ 0"),
])
def test_bench_refuses_bad_numbers_before_anything(setup, capsys, tmp_path, extra, message):
    out = tmp_path / "out"
    assert main(["bench", "--out", str(out), "--data", setup["data"], "--target", str(setup["models"]["llama-target"]),
                 "--drafter", "pld", "--methods", "fixed:pld", "--quiet", "--no-plots", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.parametrize("method", ["llama-cpp", "llama-cpp-pld:tokens=4"])
def test_bench_refuses_a_llama_cpp_method_without_its_extra_before_any_row(setup, capsys, monkeypatch, tmp_path,
                                                                          method):
    import sys

    import draftwise.bench.runner

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp raises ImportError: the extra is absent
    monkeypatch.setattr("draftwise.bench.methods.target_gguf", lambda target: str(tmp_path / "target.gguf"))

    def no_loading(*args, **kwargs):
        raise AssertionError("the models were loaded before the methods were checked")

    monkeypatch.setattr(draftwise.bench.runner, "load_workbench", no_loading)
    out = tmp_path / "out"
    assert main(["bench", "--out", str(out), "--data", setup["data"], "--target", str(setup["models"]["llama-target"]),
                 "--drafter", "pld", "--methods", method, "--quiet", "--no-plots", "--max-new-tokens", "4"]) == 2
    err = capsys.readouterr().err
    expected = f'method {method} needs llama-cpp-python: pip install -e ".[llama-cpp]" (it builds from source: minutes)'
    assert expected in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_bench_device_reaches_the_models_and_a_bad_one_is_one_clear_error(setup, capsys, tmp_path):
    """``--device`` (CUDA users' bench) moves every model there; one the machine lacks is one line."""
    argv = ["bench", "--data", setup["data"], "--target", str(setup["models"]["llama-target"]),
            "--drafter", "pld", "--methods", "fixed:pld", "--quiet", "--no-plots", "--max-new-tokens", "4"]
    assert main([*argv, "--out", str(tmp_path / "bad"), "--device", "nonsense"]) == 2
    err = capsys.readouterr().err
    assert "device 'nonsense'" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert main([*argv, "--out", str(tmp_path / "cpu"), "--device", "cpu", "--batch-size", "2"]) == 0
    env = json.loads((tmp_path / "cpu" / "batch-env.json").read_text())
    assert env["config"]["device"] == "cpu"


def test_router_without_training_prompts_names_what_is_missing(setup, capsys, monkeypatch, tmp_path):
    import draftwise.bench.datasets as datasets
    import draftwise.bench.router_training as router_training

    monkeypatch.delenv("DRAFTWISE_ZOO_CORPUS", raising=False)
    monkeypatch.setattr(datasets, "regenerate_zoo_corpus", lambda *args, **kwargs: None)  # no shared datasets
    monkeypatch.setattr(router_training, "shipped_router_path", lambda: tmp_path / "no-router.npz", raising=False)
    cfg = config(setup, "no-router", "router", router_train=None)
    assert main(cli_args(cfg)) == 2
    err = capsys.readouterr().err
    assert "router" in err and "training prompts" in err and "--router-train" in err, err
    assert "no prompts: pass --data" not in err  # --data was passed: the prompts are not what is missing
    assert not Path(cfg.out).exists()


def test_the_zoo_ships_a_trained_router_the_bench_uses(setup):
    from draftwise.bench.router import load_router, save_router
    from draftwise.bench.router_training import bench_router, shipped_router_path

    router, info = bench_router(config(setup, "shipped", "router", router_train=None))
    assert info["file"] == str(shipped_router_path()) and info["built_with"].startswith("draftwise zoo router")
    assert info["seed"] == 0 and info["per_label"] == 400 and set(info["hyperparameters"]) >= {"steps", "l2"}
    assert {"code", "math", "sql", "translation"} <= set(router.labels)
    assert router.predict(["Write a Python function that returns the square of a number.",
                           "Translate to German: Good morning."]) == ["code", "translation"]
    copy_path = Path(setup["root"]) / "router-copy.npz"
    save_router(router, copy_path, info)
    again, again_info = load_router(copy_path)
    assert again.vocabulary == router.vocabulary and again.labels == router.labels and again_info == info
    assert (again.weights == router.weights).all() and (again.idf == router.idf).all()


def test_the_default_data_folder_follows_the_checkout_not_the_cwd(monkeypatch, tmp_path, capsys):
    import draftwise
    from draftwise.bench.datasets import default_data_dir, project_root

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DRAFTWISE_DATA", raising=False)
    checkout = Path(draftwise.__file__).resolve().parents[2]
    assert project_root() == checkout  # the tests run from a source checkout
    assert default_data_dir()[0] == checkout.parent / "shared" / "data"
    monkeypatch.setenv("DRAFTWISE_DATA", str(tmp_path / "my-data"))
    assert default_data_dir()[0] == tmp_path / "my-data"
    assert main(["zoo", "build", "--out", str(tmp_path / "build"), "--budget", "tiny"]) == 2
    err = capsys.readouterr().err
    assert f"data folder {tmp_path / 'my-data'} ($DRAFTWISE_DATA) does not exist" in err, err
    assert not (tmp_path / "build").exists()


def test_named_prompt_sets_run_side_by_side(setup, monkeypatch, capsys) -> None:
    """``--data self_instruct --data zoo:test``: the out-of-domain set and the zoo's test split in one run,
    --per-domain applied to each, ids stable so that a rerun resumes every row."""
    root = Path(setup["root"])
    (root / "shared" / "self_instruct").mkdir(parents=True, exist_ok=True)
    write_jsonl(root / "shared" / "self_instruct" / "seed_tasks.jsonl", [
        {"id": f"seed_task_{i}", "instruction": "the cat sat", "instances": [{"input": text, "output": ""}]}
        for i, text in enumerate(["", "on the mat", "and then"])])
    for domain in ("code", "math"):
        (root / "zoo" / "test").mkdir(parents=True, exist_ok=True)
        write_jsonl(root / "zoo" / "test" / f"{domain}.jsonl", [{"instruction": f"x = {i}", "response": ""}
                                                                for i in range(4)])
    monkeypatch.setenv("DRAFTWISE_DATA", str(root / "shared"))
    cfg = config(setup, "named-sets", "fixed:pld", data=("self_instruct", "zoo:test"), router_train=None)
    args = cli_args(cfg) + ["--per-domain", "2", "--zoo-corpus", str(root / "zoo")]
    assert main(args) == 0
    rows = read_rows(Path(cfg.out) / "results.jsonl")
    prompt_ids = sorted({row["prompt_id"] for row in rows})
    assert len(rows) == 2 * len(prompt_ids) == 12  # ar + fixed:pld on 2 self_instruct + 2 × 2 zoo prompts
    assert prompt_ids[:2] == ["seed_tasks.jsonl:seed_task_0", "seed_tasks.jsonl:seed_task_1"]
    assert all(p.startswith(("zoo-test:code:", "zoo-test:math:")) for p in prompt_ids[2:])
    assert {row["domain"] for row in rows} == {"self_instruct", "code", "math"}
    assert main(args) == 0  # resumed by id: nothing runs again
    assert "0 new rows" in capsys.readouterr().err


# ----------------------------------------------------------------------------- batched rounds (--batch-size)


def test_batch_size_bench_reports_throughput_against_batched_ar(setup, capsys) -> None:
    cfg = config(setup, "batched", "ar,hf-ar,default,fixed:pld,length:2,banditspec-length,ucb", repeats=2)
    args = cli_args(cfg) + ["--batch-size", "1,3", "--repeats", "2"]
    assert main(args) == 0
    out = Path(cfg.out)
    rows = read_rows(out / "batch-results.jsonl")
    assert len(rows) == 2 * 7 * 2  # B × method × repeat
    summary = json.loads((out / "batch-summary.json").read_text())
    for size in ("1", "3"):
        table = summary[size]
        assert table["ar"]["speedup"] == 1.0
        for method, values in table.items():
            assert values["mismatches"] == 0, (size, method)
            assert values["tokens_per_s"] > 0 and values["repeats"] == 2
        assert table["length:2"]["mat"] > 1.0  # drafts really accepted in batches
        # the learners' time is reported apart from the bookkeeping: a fixed length has none to speak of
        # (a loose bound, not an order against ucb's ≈ 1 %: on a busy machine a preemption inside its
        # few microseconds a round once made plain decoding's share 8 %)
        assert table["ucb"]["policy_share"] > 0 and table["ar"]["policy_share"] < 0.25
        assert all(0 <= v["bookkeeping_share"] < 0.5 for v in table.values() if v["bookkeeping_share"] is not None)
    assert "| 3 | banditspec-length |" in (out / "batch-summary.md").read_text()
    # rerun: every row is already there, nothing is run again
    assert main(args) == 0
    assert len(read_rows(out / "batch-results.jsonl")) == len(rows)


def test_batch_size_bench_samples_with_one_seed_a_query(setup, capsys) -> None:
    cfg = config(setup, "batched-sampled", "ar,hf-ar,fixed:pld")
    args = cli_args(cfg) + ["--batch-size", "2", "--temperature", "0.9", "--top-k", "20"]
    assert main(args) == 0
    rows = read_rows(Path(cfg.out) / "batch-results.jsonl")
    env = json.loads((Path(cfg.out) / "batch-env.json").read_text())
    assert env["config"]["temperature"] == 0.9 and "crc32(prompt_id)" in env["seeds"]["per_generation"]
    by_method = {r["method"]: r for r in rows}
    # sampled, not greedy: the greedy reference (a plain greedy pass) differs from the sampled ar pass
    greedy = config(setup, "batched-greedy", "ar")
    assert main(cli_args(greedy) + ["--batch-size", "2"]) == 0
    greedy_ar = read_rows(Path(greedy.out) / "batch-results.jsonl")[0]
    assert greedy_ar["outputs"] != by_method["ar"]["outputs"]
    # coupled sampling: a drafter's outputs are ar's draws (the row says how many differ, here none)
    assert by_method["fixed:pld"]["differs"] == 0 and by_method["fixed:pld"]["outputs"] == by_method["ar"]["outputs"]
    assert "mismatches" not in by_method["fixed:pld"]
    assert "sampled: 0 differ" in (Path(cfg.out) / "batch-summary.md").read_text()
    # the draws (warp, noise, argmax) are timed apart from the bookkeeping; a greedy run has none
    summary = json.loads((Path(cfg.out) / "batch-summary.json").read_text())
    assert summary["2"]["ar"]["sample_share"] > 0 and by_method["ar"]["sample_s"] > 0
    assert json.loads((Path(greedy.out) / "batch-summary.json").read_text())["2"]["ar"]["sample_share"] is None
    # seeded by prompt id and repeat: a fresh run into another folder draws the same texts
    again = replace(cfg, out=cfg.out + "-again")
    assert main(cli_args(again) + ["--batch-size", "2", "--temperature", "0.9", "--top-k", "20"]) == 0
    rerun = {r["method"]: r for r in read_rows(Path(again.out) / "batch-results.jsonl")}
    for method in ("ar", "hf-ar", "fixed:pld"):
        assert rerun[method]["outputs"] == by_method[method]["outputs"], method


def test_batch_size_bench_refuses_bad_sizes_and_methods(setup, capsys) -> None:
    cfg = config(setup, "batched-bad", "ar,length:0")
    assert main(cli_args(cfg) + ["--batch-size", "0,2"]) == 2
    assert "--batch-size takes batch sizes" in capsys.readouterr().err
    assert main(cli_args(cfg) + ["--batch-size", "2"]) == 2
    assert "length:K needs a draft length" in capsys.readouterr().err
    assert not Path(cfg.out).exists()
