"""The bench gives every method fresh drafters built like the pool's: options kept (an LM drafter's
draft tree), heavy shared parts shared (a retrieval datastore is not copied per method)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftwise.bench.methods import build_method
from draftwise.bench.runner import BenchConfig, load_workbench
from draftwise.retrieval.datastore import Datastore

torch.set_num_threads(1)


def _config(tmp_path: Path, target: Path, drafters: tuple[str, ...]) -> BenchConfig:
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"prompt": "the cat sat on the mat", "domain": "d"}) + "\n")
    return BenchConfig(out=str(tmp_path / "out"), data=(str(data),), target=str(target), drafters=drafters,
                       max_new_tokens=6, warmup_tokens=0, progress=False)


def test_bench_keeps_an_lm_drafters_tree_options(tiny_models, tmp_path):
    spec = f"lm:model={tiny_models['llama-near']},tree=dynamic,topk=2,budget=6,name=dyn"
    bench = load_workbench(_config(tmp_path, tiny_models["llama-target"], (spec, "pld")))
    assert bench.pool[0].tree.kind == "dynamic"
    method = build_method(bench, "fixed:dyn")
    drafter = method.generator.drafters[0]
    assert drafter is not bench.pool[0]  # a fresh drafter per method …
    assert (drafter.tree.kind, drafter.tree.topk, drafter.tree.budget) == ("dynamic", 2, 6)  # … with the same tree
    ids = bench.tokenizer("the cat sat on the mat")["input_ids"]
    ar = build_method(bench, "ar")
    from draftwise.request import Request

    settings = Request(max_new_tokens=6)
    assert method.run(ids, "", 0, settings).token_ids == ar.run(ids, "", 0, settings).token_ids


def test_bench_does_not_copy_a_retrieval_datastore_per_method(tiny_models, tmp_path):
    docs = [[5, 6, 7, 8, 9], [5, 6, 7, 3], [2, 5, 6, 7, 8, 4]]
    Datastore.from_documents(docs, {"vocab_size": 64}).save(tmp_path / "store")
    bench = load_workbench(_config(tmp_path, tiny_models["llama-target"], (f"rest:store={tmp_path / 'store'}",)))
    pooled = bench.pool[0]
    drafters = [build_method(bench, spec).generator.drafters[0] for spec in ("fixed:rest", "ucb")]
    for drafter in drafters:
        assert drafter is not pooled
        assert drafter.datastore is pooled.datastore  # shared (memory-mapped), not deep-copied
