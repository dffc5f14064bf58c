"""Prompt sets of ``draftwise bench``: the Self-Instruct line shape and the named sets
(``self_instruct``, ``zoo:dev``, ``zoo:test``), all from small temporary files — no models."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from draftwise.bench.datasets import (
    PROMPT_SETS,
    PromptRequest,
    load_prompt_file,
    load_prompt_sources,
)
from draftwise.bench.runner import BenchConfig, resolve_prompts
from draftwise.cli import main
from draftwise.errors import DraftwiseError

SEED_TASKS = [
    {"id": "seed_task_0", "name": "breakfast", "instruction": "Suggest a breakfast without eggs.",
     "instances": [{"input": "", "output": "Oatmeal."}], "is_classification": False},
    {"id": "seed_task_1", "name": "antonyms", "instruction": "What is the relation between the given pairs?",
     "instances": [{"input": "Night : Day :: Right : Left", "output": "Opposites."},
                   {"input": "Hot : Cold", "output": "Opposites."}], "is_classification": False},
    {"id": "seed_task_2", "name": "blank", "instruction": "Tell a joke.",
     "instances": [{"input": "  \n", "output": "..."}], "is_classification": False},
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def data_dir(tmp_path, monkeypatch) -> Path:
    """A shared datasets folder holding only the seed tasks, found through $DRAFTWISE_DATA."""
    folder = tmp_path / "data"
    write_jsonl(folder / "self_instruct" / "seed_tasks.jsonl", SEED_TASKS)
    monkeypatch.setenv("DRAFTWISE_DATA", str(folder))
    return folder


@pytest.fixture
def corpus(tmp_path, monkeypatch) -> Path:
    """A fake zoo corpus: dev and test splits per domain, each example naming its split and index."""
    monkeypatch.delenv("DRAFTWISE_ZOO_CORPUS", raising=False)
    folder = tmp_path / "corpus"
    for split in ("dev", "test"):
        for domain, n in (("code", 5), ("math", 3)):
            write_jsonl(folder / split / f"{domain}.jsonl",
                        [{"instruction": f"{split} {domain} {i}", "response": "r"} for i in range(n)])
    return folder


def test_self_instruct_lines_are_the_instruction_plus_the_first_input(tmp_path):
    prompts = load_prompt_file(write_jsonl(tmp_path / "tasks.jsonl", SEED_TASKS))
    assert [(p.id, p.domain) for p in prompts] == [
        ("tasks.jsonl:seed_task_0", "self_instruct"), ("tasks.jsonl:seed_task_1", "self_instruct"),
        ("tasks.jsonl:seed_task_2", "self_instruct")]
    assert prompts[0].text == "Suggest a breakfast without eggs."  # empty input: the instruction alone
    assert prompts[1].text == "What is the relation between the given pairs?\n\nNight : Day :: Right : Left"
    assert prompts[2].text == "Tell a joke."  # a blank input adds nothing


def test_a_malformed_self_instruct_line_names_its_line(tmp_path):
    bad = {**SEED_TASKS[0], "instances": "not a list"}
    path = write_jsonl(tmp_path / "tasks.jsonl", [SEED_TASKS[0], bad])
    with pytest.raises(DraftwiseError, match=r"tasks\.jsonl, line 2: 'instances' must be a list"):
        load_prompt_file(path)


def test_self_instruct_resolves_from_the_data_folder(data_dir):
    prompts = load_prompt_sources(["self_instruct"], PromptRequest())
    assert [p.id for p in prompts] == [f"seed_tasks.jsonl:seed_task_{i}" for i in range(3)]
    assert load_prompt_sources(["self_instruct"], PromptRequest(per_domain=2)) == prompts[:2]
    # the set and its file give the same ids: rows resume whichever way the prompts were named
    assert load_prompt_sources([str(data_dir / "self_instruct" / "seed_tasks.jsonl")], PromptRequest()) == prompts


def test_zoo_splits_sample_per_domain_from_the_held_out_split(corpus):
    test = load_prompt_sources(["zoo:test"], PromptRequest(per_domain=2, zoo_corpus=str(corpus), seed=3))
    assert [p.domain for p in test] == ["code", "code", "math", "math"]
    assert all(p.text.startswith(f"test {p.domain} ") and p.id == f"zoo-test:{p.domain}:{p.text.split()[-1]}"
               for p in test)
    again = load_prompt_sources(["zoo:test"], PromptRequest(per_domain=2, zoo_corpus=str(corpus), seed=3))
    assert again == test  # stable: the same seed picks the same prompts
    every = load_prompt_sources(["zoo:test"], PromptRequest(zoo_corpus=str(corpus)))
    assert len(every) == 8  # no --per-domain: up to 8 per domain (here all 5 + 3)


def test_named_sets_and_files_mix_with_unique_ids(data_dir, corpus, tmp_path):
    mine = write_jsonl(tmp_path / "mine.jsonl", [{"prompt": "hello", "domain": "code"}])
    request = PromptRequest(per_domain=1, zoo_corpus=str(corpus))
    prompts = load_prompt_sources(["self_instruct", "zoo:dev", "zoo:test", str(mine), str(mine)], request)
    ids = [p.id for p in prompts]
    assert ids[0] == "seed_tasks.jsonl:seed_task_0" and len(ids) == len(set(ids)) == 7
    # --per-domain applies to each source: dev and test both keep their code prompt, the file its own
    assert [p.text.split()[0] for p in prompts if p.id.startswith("zoo-")] == ["dev", "dev", "test", "test"]
    assert ids[-2:] == ["mine.jsonl:1", "mine.jsonl:1~2"]


def test_the_bench_config_reaches_the_named_sets(data_dir, corpus, tmp_path):
    config = BenchConfig(out=str(tmp_path / "out"), data=("self_instruct", "zoo:test"), per_domain=1,
                         zoo_corpus=str(corpus))
    assert [p.id.split(":")[0] for p in resolve_prompts(config)] == ["seed_tasks.jsonl", "zoo-test", "zoo-test"]
    default = resolve_prompts(BenchConfig(out=str(tmp_path / "out"), zoo_corpus=str(corpus)))
    assert {p.text.split()[0] for p in default} == {"dev"}  # no --data: the dev split, as before


@pytest.mark.parametrize("spec, message", [
    ("zoo:train", "--data zoo:train: no such prompt set or file; named sets: self_instruct, zoo:dev, zoo:test"),
    ("selfinstruct", "--data selfinstruct: no such prompt set or file"),
    ("nowhere/prompts.jsonl", "prompt file nowhere/prompts.jsonl not found"),
])
def test_an_unknown_name_is_one_clear_error(spec, message, tmp_path, capsys):
    with pytest.raises(DraftwiseError, match=re.escape(message)):
        load_prompt_sources([spec], PromptRequest())
    out = tmp_path / "out"
    assert main(["bench", "--out", str(out), "--data", spec, "--quiet"]) == 2  # before any model loads
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_a_missing_data_folder_or_file_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_DATA", str(tmp_path / "absent"))
    with pytest.raises(DraftwiseError, match=r"prompt set self_instruct: .*absent/self_instruct/seed_tasks\.jsonl "
                                             r"not found \(\$DRAFTWISE_DATA\); set \$DRAFTWISE_DATA"):
        load_prompt_sources(["self_instruct"], PromptRequest())
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("DRAFTWISE_DATA", str(tmp_path / "empty"))
    with pytest.raises(DraftwiseError, match=r"prompt set self_instruct: .*empty/self_instruct/seed_tasks\.jsonl"):
        load_prompt_sources(["self_instruct"], PromptRequest())


def test_a_zoo_split_missing_from_the_corpus_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("DRAFTWISE_ZOO_CORPUS", raising=False)
    write_jsonl(tmp_path / "corpus" / "dev" / "code.jsonl", [{"instruction": "x", "response": "y"}])
    request = PromptRequest(zoo_corpus=str(tmp_path / "corpus"))
    assert len(load_prompt_sources(["zoo:dev"], request)) == 1
    with pytest.raises(DraftwiseError, match=r"no zoo corpus at .*corpus: expected test/DOMAIN\.jsonl"):
        load_prompt_sources(["zoo:test"], request)


def test_every_named_set_is_registered():
    assert list(PROMPT_SETS) == ["self_instruct", "zoo:dev", "zoo:test"]
