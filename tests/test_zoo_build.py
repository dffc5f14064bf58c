"""A tiny-budget zoo build from the shared datasets: runs in seconds and yields loadable models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftwise.errors import DraftwiseError
from draftwise.training.build import run_build
from draftwise.training.corpus import DOMAINS, read_corpus
from draftwise.training.evaluate import evaluate_zoo, format_table
from draftwise.training.install import install_zoo
from draftwise.zoo import load

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"shared datasets not found at {DATA.resolve()}")


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("zoo_build")
    run_build(DATA, out, "tiny", threads=1)
    return out


@needs_data
def test_tiny_build_splits_are_disjoint_from_training(tiny_build: Path) -> None:
    corpus = read_corpus(tiny_build / "corpus")
    for domain in DOMAINS:
        train = {e.instruction for e in corpus.train[domain]}
        held = {e.instruction for e in corpus.dev[domain]} | {e.instruction for e in corpus.test[domain]}
        assert corpus.dev[domain] and corpus.train[domain], domain
        assert not train & held, domain
    meta = json.loads((tiny_build / "build.json").read_text())
    assert meta["seed"] == meta["budget"]["seed"]
    assert set(meta["drafters"]) == {"code", "math", "sql", "translation", "summarization", "qa", "generalist"}


@needs_data
def test_tiny_build_installs_and_loads_by_name(tiny_build: Path, tmp_path: Path) -> None:
    models = install_zoo(tiny_build, tmp_path / "zoo")
    drafters = {"code", "math", "sql", "translation", "summarization", "qa", "generalist"}
    assert set(load.zoo_drafter_names(models)) == drafters
    path = load.resolve_zoo_name("zoo:code", models)
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=3, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] == ids["input_ids"].shape[1] + 3 or tokenizer.eos_token_id in out[0].tolist()
    # reinstalling keeps what the build does not make (heads installed by `zoo heads`)
    manifest = json.loads((models / load.MANIFEST).read_text())
    (models / "eagle-x").mkdir()
    manifest["models"].append({"name": "eagle-x", "role": "head", "domains": ["math"], "params": 1})
    (models / load.MANIFEST).write_text(json.dumps(manifest))
    install_zoo(tiny_build, models)
    assert "eagle-x" in [e["name"] for e in json.loads((models / load.MANIFEST).read_text())["models"]]
    (models / "eagle-x").rmdir()
    result = evaluate_zoo(tiny_build, n_prompts=1, max_new_tokens=4, models=models, domains=("math", "qa"))
    assert set(result["cells"]["math"]) == {"math", "qa"}
    assert "| drafter | math | qa |" in format_table(result)


@needs_data
def test_rebuild_resumes_without_retraining(tiny_build: Path) -> None:
    before = (tiny_build / "models" / "target" / "model.safetensors").stat().st_mtime_ns
    run_build(DATA, tiny_build, "tiny", threads=1)
    assert (tiny_build / "models" / "target" / "model.safetensors").stat().st_mtime_ns == before
    with pytest.raises(DraftwiseError, match="tiny"):
        run_build(DATA, tiny_build, "full")


def test_build_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(DraftwiseError, match="does not exist"):
        run_build(tmp_path / "nowhere", tmp_path / "out", "tiny")
    with pytest.raises(DraftwiseError, match="unknown zoo build budget"):
        run_build(tmp_path, tmp_path / "out2", "huge")
    with pytest.raises(DraftwiseError, match="unknown zoo build stage"):
        run_build(tmp_path, tmp_path / "out3", "tiny", until="bake")
