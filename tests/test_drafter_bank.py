"""The lean drafter path computes what transformers computes (1e-4), one drafter or a whole bank."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from draftwise.drafters import LMDrafter
from draftwise.drafters.pool import attach_banks
from draftwise.models.drafter_bank import BankLM, LlamaBank, bank_key

TOL = 1e-4


def _llamas(count: int, **overrides) -> list[LlamaForCausalLM]:
    torch.manual_seed(0)
    config = dict(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.1)
    config.update(overrides)
    return [LlamaForCausalLM(LlamaConfig(**config)).eval() for _ in range(count)]


@torch.inference_mode()
def _fresh(model, tokens: list[int], n_out: int) -> torch.Tensor:
    return model(torch.tensor([tokens])).logits[0, -n_out:].float()


@pytest.mark.parametrize("tied", [True, False])
def test_bank_views_match_transformers_through_crops_and_extends(tied: bool) -> None:
    models = _llamas(3, tie_word_embeddings=tied)
    bank = LlamaBank(models, head_dtype="float32")  # the same maths as transformers, to 1e-6
    views = [BankLM(bank, slot, m) for slot, m in enumerate(models)]
    rng = random.Random(0)
    tokens = [rng.randrange(97) for _ in range(5)]
    for step in range(40):
        view = views[rng.randrange(3)]
        draft = [rng.randrange(97) for _ in range(rng.randint(0, 4))]
        got = view.logits(tokens + draft, len(draft) + 1)
        assert torch.allclose(got, _fresh(view.model, tokens + draft, len(draft) + 1), atol=TOL)
        if draft:
            more = view.extend([rng.randrange(97)], 1)
            assert torch.allclose(more, _fresh(view.model, view.tokens, 1), atol=TOL)
        tokens = tokens + draft[: rng.randint(0, len(draft))] + [rng.randrange(97)]
        if step % 5 == 4:  # the whole bank catches up in one batched forward
            n_out = rng.randint(1, 3)
            every = bank.sync_all(tokens, n_out)
            for slot, model in enumerate(models):
                assert torch.allclose(every[slot], _fresh(model, tokens, n_out), atol=TOL)


def test_cache_is_made_at_the_first_forward_and_grows_past_its_first_capacity() -> None:
    models = _llamas(2)
    bank = LlamaBank(models, head_dtype="float32")
    assert bank.capacity == 0 and not bank.keys  # a query that never drafts with a model pays nothing
    tokens = [i % 97 for i in range(300)]  # beyond the first 256 slots
    view = BankLM(bank, 1, models[1])
    assert torch.allclose(view.logits(tokens[:10], 1), _fresh(models[1], tokens[:10], 1), atol=TOL)
    assert bank.capacity == 256
    assert not bank.keys[0].is_inference()  # made inside a forward, yet writable outside one (a tree's moves)
    assert torch.allclose(view.logits(tokens, 2), _fresh(models[1], tokens, 2), atol=TOL)


def test_only_plain_llamas_of_one_shape_share_a_bank() -> None:
    a, b = _llamas(2)
    (c,) = _llamas(1, num_hidden_layers=1)
    gpt = GPT2LMHeadModel(GPT2Config(vocab_size=97, n_embd=32, n_layer=1, n_head=4)).eval()
    assert bank_key(a) == bank_key(b) != bank_key(c)
    assert bank_key(gpt) is None
    assert bank_key(_llamas(1, attention_bias=True)[0]) is None
    drafters = [LMDrafter(m, name=n) for m, n in ((a, "a"), (b, "b"), (c, "c"), (gpt, "gpt"))]
    banks = attach_banks(drafters)
    assert sorted(bank.count for bank in banks) == [1, 2]
    assert drafters[0].bank is drafters[1].bank and drafters[3].bank is None


def test_bfloat16_head_is_close_to_float32_and_batched_equals_one_by_one() -> None:
    models = _llamas(3)
    bank = LlamaBank(models, head_dtype="bfloat16")
    tokens = [(7 * i) % 97 for i in range(12)]
    every = bank.sync_all(tokens, 3)
    for slot, model in enumerate(models):
        exact = _fresh(model, tokens, 3)
        assert every[slot].dtype == torch.float32
        assert torch.allclose(every[slot], exact, atol=0.05, rtol=0.02)  # bfloat16 rounding, not a bug
        # what the evaluation phase scores (batched) is what the drafter computes alone
        alone = LlamaBank(models, head_dtype="bfloat16")
        assert torch.equal(BankLM(alone, slot, model).logits(tokens, 3), every[slot])


@pytest.mark.parametrize("head_dtype", ["float32", "bfloat16"])
def test_top1_all_agrees_with_the_logits(head_dtype: str) -> None:
    """Routing's top-1 hits (scored per drafter in the head's precision) are those of the full logits."""
    from draftwise.verify.chain import top1_hits

    models = _llamas(3)
    tokens = [(5 * i + 3) % 97 for i in range(20)]
    targets = torch.tensor(tokens[-8:])
    logits = LlamaBank(models, head_dtype=head_dtype).sync_all(tokens[:-1], 8)
    hits = LlamaBank(models, head_dtype=head_dtype).top1_all(tokens[:-1], targets)
    assert hits.shape == (3, 8) and hits.dtype == torch.bool
    every = targets.expand(3, 8)
    assert torch.equal(hits, top1_hits(logits, every))
    assert torch.equal(hits, logits.argmax(-1) == every)  # no ties here


def test_head_dtype_is_checked() -> None:
    with pytest.raises(ValueError, match="head_dtype 'int8'"):
        LlamaBank(_llamas(1), head_dtype="int8")
