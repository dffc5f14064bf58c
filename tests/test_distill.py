"""Distilling drafters for a real target: vocabulary choice, the target's answers, the bulk signal
(features and soft labels) and the rows cut from it, and drafters trained on it that round-trip
through their folders into the engine (tiny models)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from draftwise import Generator
from draftwise.drafters import build_drafters
from draftwise.errors import DraftwiseError
from draftwise.models.loading import LoadOptions, load_causal_lm
from draftwise.models.numerics import Int4Linear
from draftwise.models.vocab_map import VocabMap
from draftwise.training.distill import (
    DrafterRecipe,
    choose_vocabulary,
    new_drafter,
    save_drafter,
    train_drafter_on_signal,
)
from draftwise.training.distill_eagle import SignalHeadRecipe, train_signal_head
from draftwise.training.evaluate import head_stats
from draftwise.training.heads import soft_cross_entropy
from draftwise.training.signal import ChatText, DenseInt4Linear, SignalPlan, bulk_target, read_sequences
from draftwise.training.signal_rows import SignalRows, learn_mask, signal_chunks
from draftwise.training.train import ModelShape, TrainConfig

LAYERS = (1, -1)  # what the tiny signal keeps: the first layer's output and the final one


@pytest.fixture(scope="module")
def signal(tiny_models, tmp_path_factory):
    """Two domains of random sequences read by the tiny target: (target, tokenizer, signal root, sequences)."""
    target, tokenizer, numerics = bulk_target(str(tiny_models["llama-target"]))
    assert numerics == "float32"
    root = tmp_path_factory.mktemp("signal")
    rng = np.random.default_rng(0)
    texts = {d: [ChatText(f"{d}{i}", rng.integers(2, 56, int(rng.integers(12, 40))).tolist(), int(rng.integers(2, 6)))
                 for i in range(12)] for d in ("code", "math")}
    plan = SignalPlan(layers=LAYERS, top_k=4, batch_tokens=64, chunk_tokens=120)
    for domain, items in texts.items():
        read_sequences(target, items, root / "corpus" / domain, plan, token_budget=10_000)
    (root / "signal.json").write_text(json.dumps({"plan": {"layers": list(LAYERS)}}))
    return target, tokenizer, root, texts


def test_the_vocabulary_is_the_most_frequent_answer_tokens_then_prompt_tokens() -> None:
    answers = [[5, 5, 5, 7, 7, 9], [7, 5]]
    assert choose_vocabulary(answers, 3, always=[0]) == [0, 5, 7]
    assert choose_vocabulary(answers, 5, always=[0], then=[[11, 11, 3]]) == [0, 5, 7, 9, 11]
    assert len(choose_vocabulary([[1]], 6, always=[])) == 6  # filled by id when texts run out


def test_the_bulk_pass_keeps_each_sequences_own_reading_and_resumes(signal) -> None:
    target, _, root, texts = signal
    folder = root / "corpus" / "code"
    chunks = sorted(folder.glob("[0-9]*"))
    assert len(chunks) > 1 and not list(folder.glob("tmp-*"))
    keys = [k for c in chunks for k in json.loads((c / "keys.json").read_text())]
    assert sorted(keys) == sorted(t.key for t in texts["code"])  # each sequence once
    chunk = chunks[0]
    starts, tokens = np.load(chunk / "starts.npy"), np.load(chunk / "tokens.npy")
    features, top_ids = np.load(chunk / "features.npy"), np.load(chunk / "top_ids.npy")
    for i, key in enumerate(json.loads((chunk / "keys.json").read_text())):
        text = next(t for t in texts["code"] if t.key == key)
        span = slice(starts[i], starts[i + 1])
        assert tokens[span].tolist() == text.tokens and np.load(chunk / "prompt_lens.npy")[i] == text.prompt_len
        with torch.no_grad():  # alone, not beside the batch's padding
            out = target(input_ids=torch.tensor([text.tokens]), output_hidden_states=True)
        for j, layer in enumerate(LAYERS):
            assert torch.allclose(torch.from_numpy(features[span, j]).float(), out.hidden_states[layer][0], atol=2e-2)
        assert (top_ids[span, 0] == out.logits[0].argmax(-1).numpy()).all()
    more = [ChatText("code-new", [3, 4, 5, 6, 7, 8], 2)]
    plan = SignalPlan(layers=LAYERS, top_k=4, batch_tokens=64, chunk_tokens=120)
    assert read_sequences(target, texts["code"] + more, folder, plan, token_budget=10_000) == 6  # only the new one


def test_the_learned_positions_are_those_whose_next_token_is_in_the_same_response() -> None:
    starts, prompts = np.array([0, 5, 9]), np.array([2, 3])
    assert np.flatnonzero(learn_mask(starts, prompts, responses_only=True)).tolist() == [1, 2, 3, 7]
    assert np.flatnonzero(learn_mask(starts, prompts, responses_only=False)).tolist() == [0, 1, 2, 3, 5, 6, 7]


def test_signal_rows_are_windows_of_the_packed_sequences(signal) -> None:
    _, _, root, _ = signal
    chunks = signal_chunks(root, ("corpus",), ("code", "math"))
    rows = SignalRows(chunks, 16, LAYERS, (-1, 1))
    total = sum(int(np.load(c / "starts.npy")[-1]) // 16 for c in chunks)
    assert len(rows) == total and rows.tokens() == 16 * total
    batch = rows.batch(np.array([0, len(rows) - 1]))
    assert batch.tokens.shape == (2, 16) and batch.top_ids.shape == (2, 16, 4)
    assert batch.features.shape == (2, 16, 2, 32)
    first = np.load(chunks[0] / "features.npy")[:16]
    assert torch.equal(batch.features[0, :, 0], torch.from_numpy(first[:, 1]).float())  # layer −1, asked first
    assert SignalRows(chunks, 16, LAYERS, ()).batch(np.array([0])).features.numel() == 0  # no layers: none read


def test_dense_int4_products_are_the_int4_kernels_up_to_bfloat16_rounding() -> None:
    weight = torch.randn(48, 64, generator=torch.Generator().manual_seed(0)) * 0.05
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))
    exact, dense = Int4Linear(weight, None)(x), DenseInt4Linear(weight, None)(x)
    # the same 4-bit weights; the kernel's sums and the dense product's differ by about a bfloat16 step (2⁻⁸)
    assert torch.allclose(dense, exact, rtol=1e-2, atol=4e-3)
    assert not torch.allclose(dense, x @ weight.T, rtol=1e-2, atol=4e-3)  # the 4-bit weights, not the float ones


def test_a_drafter_distilled_on_the_signal_loads_from_its_folder_and_stays_lossless(signal, tmp_path) -> None:
    target, tokenizer, root, _ = signal
    options = LoadOptions()
    recipe = DrafterRecipe(shape=ModelShape(layers=1, hidden=16, intermediate=32, heads=2, max_positions=256),
                           kv_heads=2, vocab=24)
    rng = np.random.default_rng(0)
    vocab = VocabMap(choose_vocabulary([rng.integers(2, 56, 40).tolist()], recipe.vocab - 1, always=[0]), 56)
    model = new_drafter(recipe, target, vocab, seed=0)
    rows = SignalRows(signal_chunks(root, ("corpus",), ("code",)), 32, LAYERS, (), responses_only=True)
    config = replace(recipe.generalist, steps=3, batch=4, seq_len=32, warmup=1)
    meta = train_drafter_on_signal(model, rows, vocab, config, seed=0, checkpoint=tmp_path / "ckpt", label="tiny")
    assert meta["steps"] == 3 and np.isfinite(meta["final_loss"]) and meta["signal_tokens"] == rows.tokens()
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


def test_a_fused_head_trained_on_the_signal_loads_and_replays_the_engines_rounds(signal, tmp_path) -> None:
    target, tokenizer, root, _ = signal
    options = LoadOptions()
    rng = np.random.default_rng(1)
    vocab = VocabMap(choose_vocabulary([rng.integers(2, 56, 60).tolist()], 20, always=[0]), 56)
    recipe = SignalHeadRecipe(feature_layers=LAYERS, intermediate=32, unroll=3,
                              train=TrainConfig(steps=3, batch=2, seq_len=16, lr=1e-3, warmup=1, weight_decay=0.0))
    rows = SignalRows(signal_chunks(root, ("corpus",), ("code", "math")), 16, LAYERS, (*LAYERS, -1))
    folder = train_signal_head(target, "tiny", rows, vocab, tmp_path / "work", tmp_path / "eagle", recipe,
                               ("code", "math"))
    meta = json.loads((folder / "training.json").read_text())
    assert meta["step"] == 3 and meta["train_tokens"] == rows.tokens() and np.isfinite(meta["last_loss"])
    [drafter] = build_drafters([f"eagle:head={folder}"], target, tokenizer, options)
    assert drafter.feature_layers == LAYERS and drafter.head_weight.shape[0] == 20  # the subset's rows only
    gen = Generator(target, tokenizer, [drafter], policy="fixed:0", draft_len=3)
    plain = Generator(target, tokenizer, [], policy="fixed:none")
    prompt = rng.integers(2, 56, 8).tolist()
    result = gen.generate(prompt, max_new_tokens=20)
    assert result.token_ids == plain.generate(prompt, max_new_tokens=20).token_ids
    assert sum(r.drafted for r in result.trace) > 0
    # the offline evaluation replays the engine's greedy rounds exactly, fused layers included
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


def test_a_head_started_from_a_trained_one_drafts_as_it_does(tiny_models, tmp_path) -> None:
    from draftwise.drafters.eagle import EagleHead, eagle_config
    from draftwise.drafters.whitebox import save_head, target_dims
    from draftwise.training.distill_eagle import start_from

    target, _ = load_causal_lm(str(tiny_models["llama-target"]), LoadOptions())
    hidden, vocab = target_dims(target)
    shape = dict(num_attention_heads=2, num_key_value_heads=1, intermediate_size=32)
    torch.manual_seed(0)
    plain = EagleHead(eagle_config(hidden, vocab, **shape)).eval()
    save_head(plain, plain.config, tmp_path / "plain", dtype=torch.float32)
    fused = EagleHead(eagle_config(hidden, vocab, feature_layers=LAYERS, **shape)).eval()
    start_from(fused, tmp_path / "plain")
    tokens = torch.tensor([[5, 9, 13, 17, 21, 25]])
    with torch.no_grad():
        states = target(tokens, output_hidden_states=True).hidden_states
        embeds = target.get_input_embeddings()(tokens)
        positions = torch.arange(6)[None]
        both = torch.cat([states[1], states[-1]], -1)
        assert torch.allclose(fused(both, embeds, positions)[0], plain(states[-1], embeds, positions)[0], atol=1e-5)
        fused.fuse.weight.add_(0.1 * torch.randn_like(fused.fuse.weight))  # as training moves it
        save_head(fused, fused.config, tmp_path / "fused", dtype=torch.float32)
        again = EagleHead(fused.config).eval()
        start_from(again, tmp_path / "fused")  # continuing a fused head keeps its fusion
        assert torch.equal(again.fuse.weight, fused.fuse.weight)
        assert torch.allclose(again(both, embeds, positions)[0], fused(both, embeds, positions)[0], atol=1e-5)
    medusa_like = EagleHead(eagle_config(hidden, vocab, num_attention_heads=2, num_key_value_heads=1,
                                         intermediate_size=16))
    with pytest.raises(DraftwiseError, match="not a head of this shape"):
        start_from(medusa_like, tmp_path / "plain")
