"""The model zoo: naming, loading through the plain HF path, the acceptance maths, resumable training."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftwise.errors import DraftwiseError
from draftwise.training import evaluate
from draftwise.training.evaluate import RoundStats, greedy_rounds
from draftwise.training.train import ModelShape, SpecialIds, TrainConfig, new_model, next_token_loss, train_loop
from draftwise.zoo import load

SHIPPED = load.shipped_models_dir()
needs_shipped_zoo = pytest.mark.skipif(
    not (SHIPPED / load.MANIFEST).exists(), reason="no zoo shipped in src/draftwise/zoo/models yet"
)


def test_greedy_rounds_docstring_examples() -> None:
    assert doctest.testmod(evaluate).failed == 0


@pytest.mark.parametrize(
    ("match", "k", "expected"),
    [
        ([], 5, RoundStats(0, 0, 0, 0)),
        ([True] * 12, 5, RoundStats(12, 2, 10, 10, 2, 2)),  # 5 + bonus, 5 + bonus
        ([True, False, True], 5, RoundStats(3, 2, 2, 4, 2, 2)),  # t1 + bonus t2; then t3 accepted, no bonus
        ([False, True, True], 5, RoundStats(3, 2, 2, 5, 2, 1)),  # t1 the target's; then t2 t3 accepted, no bonus
    ],
)
def test_greedy_rounds_edge_cases(match: list[bool], k: int, expected: RoundStats) -> None:
    assert greedy_rounds(match, k) == expected


def test_greedy_rounds_equals_explicit_draft_and_verify_simulation() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        match = list(rng.random(int(rng.integers(1, 40))) < 0.7)
        k = int(rng.integers(1, 7))
        # explicit: at verified length c the drafter proposes tokens c..c+k-1; accept the matching run
        c = rounds = 0
        while c < len(match):
            n = 0
            while n < min(k, len(match) - c) and match[c + n]:
                n += 1
            c += n + 1
            rounds += 1
        assert greedy_rounds(match, k).rounds == rounds


def test_zoo_names_reject_bad_input(tmp_path: Path) -> None:
    with pytest.raises(DraftwiseError, match="no model zoo"):
        load.zoo_names(tmp_path)
    with pytest.raises(DraftwiseError, match="not a zoo name"):
        load.resolve_zoo_name("gpt2", tmp_path)


def test_train_loop_resumes_to_identical_weights(tmp_path: Path) -> None:
    shape = ModelShape(layers=1, hidden=16, intermediate=32, heads=2, max_positions=64)
    ids = SpecialIds(pad=0, eos=1)
    rows = torch.randint(2, 50, (12, 16), generator=torch.Generator().manual_seed(0))
    config = TrainConfig(steps=4, batch=3, seq_len=16, lr=1e-2, warmup=1, checkpoint_seconds=0.0)

    def loss(m, index):
        return next_token_loss(m, rows[torch.from_numpy(index)], ids.pad)

    straight = new_model(shape, 50, ids, seed=3)
    train_loop(straight, len(rows), loss, config, 7, tmp_path / "a.pt", "a", progress=False)

    calls = {"n": 0}

    def crashing_loss(m, index):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # the build is killed during step 3
        return loss(m, index)

    interrupted = new_model(shape, 50, ids, seed=3)
    with pytest.raises(KeyboardInterrupt):
        train_loop(interrupted, len(rows), crashing_loss, config, 7, tmp_path / "b.pt", "b", progress=False)
    resumed = new_model(shape, 50, ids, seed=3)
    state = train_loop(resumed, len(rows), loss, config, 7, tmp_path / "b.pt", "b", progress=False)
    assert state.step == 4
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name


@needs_shipped_zoo
def test_shipped_zoo_names_and_size() -> None:
    names = load.zoo_names()
    assert names[0] == "zoo:target"
    specialists = {"zoo:code", "zoo:math", "zoo:sql", "zoo:translation", "zoo:summarization", "zoo:qa"}
    assert specialists | {"zoo:generalist"} <= set(names)
    heads = {f"zoo:{h}" for h in load.zoo_head_names(target=None)}  # white-box heads: by name, never in zoo:all
    real = {f"zoo:smollm2-{d}" for d in ("generalist", "code", "math", "sql", "translation", "summarization", "qa")}
    assert set(load.expand_zoo_names(["zoo:all"])) == set(names) - {"zoo:target"} - heads - real
    assert set(load.expand_zoo_names(["zoo:all"], target="smollm2")) == real  # each target's own drafters
    assert load.zoo_head_names(target="smollm2") == ["smollm2-eagle"]
    assert load.expand_zoo_names(["zoo:code", "zoo:all"])[0] == "zoo:code"
    total = sum(p.stat().st_size for p in SHIPPED.rglob("*") if p.is_file())
    assert total <= 80 * 2**20  # the package's weights, both families
    with pytest.raises(DraftwiseError, match="unknown zoo model"):
        load.resolve_zoo_name("zoo:nope")


@needs_shipped_zoo
def test_shipped_zoo_loads_through_the_plain_hf_path() -> None:
    target_dir = load.resolve_zoo_name("zoo:target")
    drafter_dir = load.resolve_zoo_name("zoo:math")
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir)
    drafter = AutoModelForCausalLM.from_pretrained(drafter_dir)
    assert target.dtype == torch.float32 and drafter.dtype == torch.float32  # fp16 on disk, fp32 in memory
    assert target.config.vocab_size == drafter.config.vocab_size == len(tokenizer)
    assert AutoTokenizer.from_pretrained(drafter_dir).get_vocab() == tokenizer.get_vocab()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 12 plus 30?"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.endswith("<|assistant|>\n")
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    out = target.generate(**ids, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] > ids["input_ids"].shape[1]
    manifest = json.loads((SHIPPED / load.MANIFEST).read_text())
    assert manifest["build"]["seed"] == manifest["build"]["budget"]["seed"]
