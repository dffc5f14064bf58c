"""Distilling drafters for a real target: vocabulary choice, training streams, and a drafter that
round-trips through its folder into the engine (tiny models)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import torch

from draftwise import Generator
from draftwise.drafters import build_drafters
from draftwise.models.loading import LoadOptions, load_causal_lm
from draftwise.models.vocab_map import VocabMap
from draftwise.training.distill import (
    DrafterRecipe,
    choose_vocabulary,
    new_drafter,
    save_drafter,
    train_drafter,
    training_stream,
)
from draftwise.training.distill_eagle import EagleRecipe, train_eagle
from draftwise.training.evaluate import head_stats
from draftwise.training.heads import soft_cross_entropy
from draftwise.training.train import ModelShape, TrainConfig


def test_the_vocabulary_is_the_most_frequent_answer_tokens_then_prompt_tokens() -> None:
    answers = [[5, 5, 5, 7, 7, 9], [7, 5]]
    assert choose_vocabulary(answers, 3, always=[0]) == [0, 5, 7]
    assert choose_vocabulary(answers, 5, always=[0], then=[[11, 11, 3]]) == [0, 5, 7, 9, 11]
    assert len(choose_vocabulary([[1]], 6, always=[])) == 6  # filled by id when texts run out


def test_a_training_stream_learns_the_labels_after_each_prefix_and_nothing_else() -> None:
    vocab = VocabMap([10, 11, 12, 13], target_size=20)
    ids, targets = training_stream([([10, 11], [12, 19, 13], [12, 19, 13])], vocab)
    assert ids.tolist() == [0, 1, 2, 4, 3]  # 19 is unlisted: the "other" id
    # position 1 (the prompt's last) predicts 12; 19 cannot be proposed (−1); position 3 predicts 13
    assert targets.tolist() == [-1, 2, -1, 3, -1]
    _, choices = training_stream([([10], [11, 12], [13, 12])], vocab)  # the target's choices along a reference
    assert choices.tolist() == [3, 2, -1]


def test_a_distilled_drafter_loads_from_its_folder_and_stays_lossless(tiny_models, tmp_path) -> None:
    options = LoadOptions()
    target, tokenizer = load_causal_lm(str(tiny_models["llama-target"]), options)
    recipe = DrafterRecipe(shape=ModelShape(layers=1, hidden=16, intermediate=32, heads=2, max_positions=256),
                           kv_heads=2, vocab=24)
    rng = np.random.default_rng(0)
    vocab = VocabMap(choose_vocabulary([rng.integers(2, 56, 40).tolist()], recipe.vocab - 1, always=[0]), 56)
    model = new_drafter(recipe, target, vocab, seed=0)
    examples = [(rng.integers(2, 56, 6).tolist(), (a := rng.integers(2, 56, 10).tolist()), a) for _ in range(40)]
    config = replace(recipe.generalist, steps=3, batch=4, seq_len=32, warmup=1)
    meta = train_drafter(model, training_stream(examples, vocab), config, seed=0,
                         checkpoint=tmp_path / "ckpt", label="tiny")
    assert meta["steps"] == 3 and np.isfinite(meta["final_loss"])
    save_drafter(model, vocab, tmp_path / "drafter", {"domains": ["code"]})
    tokenizer.save_pretrained(tmp_path / "drafter")
    [drafter] = build_drafters([str(tmp_path / "drafter")], target, tokenizer, options)
    gen = Generator(target, tokenizer, [drafter], policy="fixed:0", draft_len=3)
    plain = Generator(target, tokenizer, [], policy="fixed:none")
    prompt = [3, 4, 5, 6, 3, 4]
    assert gen.generate(prompt, max_new_tokens=20).token_ids == plain.generate(prompt, max_new_tokens=20).token_ids
    assert torch.isinf(drafter.next_logits(prompt, 1)).sum() == 56 - (recipe.vocab - 1)


def test_transformers_assisted_generation_runs_a_vocabulary_subset_drafter_through_its_view(tiny_models) -> None:
    from draftwise.bench.methods import full_vocabulary_view

    options = LoadOptions()
    target, tokenizer = load_causal_lm(str(tiny_models["llama-target"]), options)
    [drafter] = build_drafters([str(tiny_models["llama-subvocab"])], target, tokenizer, options)
    view = full_vocabulary_view(drafter.model)
    ids = torch.tensor([[3, 4, 5, 6, 3, 4]])
    with torch.inference_mode():
        plain = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
        assisted = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
                                   assistant_model=view, num_assistant_tokens=3, assistant_confidence_threshold=0.0)
    assert assisted.tolist() == plain.tolist()
    assert view.model is drafter.model.model  # the same weights
    assert view.lm_head.weight.shape[0] == 56 - 7 + 1  # its own head: 49 kept ids and one for the rest


def test_labels_resume_past_a_torn_line_and_join_back_by_instruction(tmp_path) -> None:
    from draftwise.training.corpus import Example
    from draftwise.training.labels import done_keys, instruction_key, read_labels

    examples = [Example("code", "src", f"instruction {i}", "") for i in range(3)]
    path = tmp_path / "code.jsonl"
    lines = [json.dumps({"key": instruction_key(e.instruction), "answer": [i, i + 1]}) for i, e in enumerate(examples)]
    path.write_text(lines[0] + "\n" + lines[2] + "\n" + lines[1][:9])  # the last line torn by an interruption
    assert done_keys(path) == {instruction_key(examples[0].instruction), instruction_key(examples[2].instruction)}
    assert read_labels(path, examples) == [(examples[0], [0, 1]), (examples[2], [2, 3])]


def test_batched_greedy_answers_equal_one_at_a_time_decoding(tiny_models) -> None:
    from draftwise.training.labels import greedy_answers

    model, _ = load_causal_lm(str(tiny_models["llama-target"]), LoadOptions())
    generator = Generator(model, None, [], policy="fixed:none")
    generator.eos_ids = frozenset({0})
    prompts = [[3, 4, 5], [6, 7, 8, 9, 10, 11], [12], [13, 14]]
    batched = greedy_answers(generator, prompts, 24, batch_size=2)  # a finished row's place goes to the next
    for prompt, answer in zip(prompts, batched):
        ids = torch.tensor([prompt])
        alone = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
        expected = alone[0, len(prompt):].tolist()
        assert answer == (expected[: expected.index(0) + 1] if 0 in expected else expected)


def test_an_eagle_head_over_a_vocabulary_subset_trains_loads_and_stays_lossless(tiny_models, tmp_path) -> None:
    options = LoadOptions()
    target, tokenizer = load_causal_lm(str(tiny_models["llama-target"]), options)
    rng = np.random.default_rng(1)
    vocab = VocabMap(choose_vocabulary([rng.integers(2, 56, 60).tolist()], 20, always=[0]), 56)
    sequences = {"code": [rng.integers(2, 56, 24).tolist() for _ in range(4)],
                 "math": [rng.integers(2, 56, 24).tolist() for _ in range(4)]}
    recipe = EagleRecipe(examples_per_domain=3, top_k=4, intermediate=32,
                         train=TrainConfig(steps=3, batch=2, seq_len=16, lr=1e-3, warmup=1, weight_decay=0.0))
    folder = train_eagle(target, "tiny", sequences, vocab, tmp_path / "work", tmp_path / "eagle", recipe)
    meta = json.loads((folder / "training.json").read_text())
    assert meta["step"] == 3 and meta["train_tokens"] == 16 * (6 * 24 // 16) and np.isfinite(meta["last_loss"])
    [drafter] = build_drafters([f"eagle:head={folder}"], target, tokenizer, options)
    assert drafter.vocab is not None and drafter.head_weight.shape[0] == 20  # the subset's rows only
    gen = Generator(target, tokenizer, [drafter], policy="fixed:0", draft_len=3)
    plain = Generator(target, tokenizer, [], policy="fixed:none")
    prompt = rng.integers(2, 56, 8).tolist()
    result = gen.generate(prompt, max_new_tokens=20)
    assert result.token_ids == plain.generate(prompt, max_new_tokens=20).token_ids
    assert sum(r.drafted for r in result.trace) > 0
    # the offline evaluation replays the engine's greedy rounds exactly
    stats = head_stats(drafter.fresh(), target, [prompt], [result.token_ids], 3)
    assert (stats.rounds, stats.accepted) == (len(result.trace), sum(r.accepted for r in result.trace))
    logits = drafter.next_logits(prompt + result.token_ids, 1)  # it proposes only the subset's tokens
    assert torch.isinf(logits).sum() == 56 - 20 and torch.isfinite(logits[0, vocab.to_target]).all()


def test_the_soft_loss_ignores_tokens_outside_the_subset() -> None:
    features, weight = torch.randn(2, 3, 4), torch.randn(5, 4)
    ids = torch.tensor([[[0, 1], [2, -1], [-1, -1]]] * 2)
    logprobs = torch.tensor([[[-0.1, -2.0], [-0.5, -0.2], [-0.3, -0.4]]] * 2)
    full = soft_cross_entropy(features[:, :1], weight, ids[:, :1], logprobs[:, :1])
    log_q = torch.log_softmax(features[:, 1] @ weight.T, -1)[:, 2]
    assert torch.allclose(soft_cross_entropy(features[:, 1:2], weight, ids[:, 1:2], logprobs[:, 1:2]), -log_q.mean())
    assert soft_cross_entropy(features[:, 2:], weight, ids[:, 2:], logprobs[:, 2:]) == 0  # nothing it could propose
    assert torch.isfinite(full)
