"""Greedy losslessness: token ids identical to transformers' own greedy decoding.

Randomized over prompts, lengths, draft lengths, EOS tokens (often hit mid-draft), drafter kinds
and policies, for a Llama and a GPT-2 target.
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from draftwise import Generator
from draftwise.api import DEFAULT_POLICY
from draftwise.drafters import Drafter, build_drafters
from draftwise.models.loading import LoadOptions, load_causal_lm

CASES_PER_SETUP = 36
SETUPS = {
    # name: (target, drafter specs, policies cycled through)
    "llama-lm": ("llama-target", ["llama-near", "llama-small"], ["ucb", "round-robin", "random"]),
    "llama-twin": ("llama-target", ["llama-twin"], ["fixed:0"]),  # everything accepted
    "llama-point-mass": ("llama-target", ["pld", "suffix", "pld:max_ngram=1"], ["ucb:reward=be", "round-robin"]),
    "llama-mixed": ("llama-target", ["llama-near", "pld", "suffix", "llama-twin"], ["ucb", "random", "hierarchical"]),
    "gpt2-lm": ("gpt2-target", ["gpt2-near", "pld", "suffix"], ["ucb", "round-robin"]),
    "llama-none": ("llama-target", [], ["ucb"]),  # plain decoding
    # a drafter over most of the target's vocabulary (draft_vocab.json: ids mapped in and out)
    "llama-subvocab": ("llama-target", ["llama-subvocab", "pld"], ["ucb", "hedgespec", "fixed:0", DEFAULT_POLICY]),
    # drafters with bfloat16 LM heads (the lean path's default on CPUs that multiply it natively)
    "llama-bf16-heads": ("llama-target", ["llama-near", "llama-small", "pld"], ["ucb", "hedgespec"]),
}


class AlwaysWrong(Drafter):
    """A drafter whose every token differs from the target's argmax (it peeks at the target)."""

    name = "wrong"

    def __init__(self, model) -> None:
        from draftwise.models.cached_lm import CachedLM

        self.lm = CachedLM(model)

    def propose(self, context, max_len, ctx, stop=None):
        from draftwise.drafters import Draft

        tokens: list[int] = []
        for _ in range(max_len):
            best = int(self.lm.logits(list(context) + tokens, 1)[0].argmax())
            tokens.append((best + 1) % self.lm.vocab_size)
        return Draft(tokens)


def _reference(model, prompt: list[int], max_new: int, eos: int | None) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                         eos_token_id=eos, pad_token_id=0, min_new_tokens=0)
    new = out[0, len(prompt):].tolist()
    if eos is not None and eos in new:  # generate pads after EOS
        new = new[: new.index(eos) + 1]
    return new


def _generator(tiny_models, target: str, specs: list[str], policy: str, head_dtype: str | None = None) -> Generator:
    options = LoadOptions()
    model, tokenizer = load_causal_lm(str(tiny_models[target]), options)
    pool = build_drafters([str(tiny_models[s]) if s in tiny_models else s for s in specs], model, tokenizer, options)
    return Generator(model, tokenizer, pool, policy=policy, drafter_head_dtype=head_dtype)


@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_greedy_matches_transformers(tiny_models, setup: str) -> None:
    target, specs, policies = SETUPS[setup]
    reference_model = AutoModelForCausalLM.from_pretrained(tiny_models[target]).eval()
    head_dtype = "bfloat16" if setup.endswith("bf16-heads") else None
    generators = [_generator(tiny_models, target, specs, policy, head_dtype) for policy in policies]
    rng = random.Random(setup)
    vocab = generators[0].target.vocab_size
    mats = []
    for case in range(CASES_PER_SETUP):
        gen = generators[case % len(generators)]
        for arm in gen.arms:
            object.__setattr__(arm, "draft_len", rng.randint(1, 8))
        prompt = [rng.randrange(2, vocab) for _ in range(rng.randint(1, 24))]
        if case % 3 == 0:  # repetitive prompts give the lookup drafters something to match
            prompt = (prompt[:5] * 6)[: rng.randint(6, 30)]
        max_new = rng.randint(1, 48)
        eos = rng.choice([None, 0, *prompt[:3]])  # prompt tokens are likely continuations: EOS mid-draft
        gen.eos_ids = frozenset() if eos is None else frozenset({eos})
        expected = _reference(reference_model, prompt, max_new, eos)
        result = gen.generate(prompt, max_new_tokens=max_new, seed=case)
        assert result.token_ids == expected, f"{setup} case {case}: prompt={prompt} max_new={max_new} eos={eos}"
        assert result.stats.new_tokens == len(expected)
        assert sum(r.emitted for r in result.trace) == len(expected)
        if setup == "llama-twin":  # an identical drafter is always accepted
            assert result.stats.accepted == result.stats.drafted
        mats.append((policies[case % len(generators)], result.stats.mat))
    mats_of = lambda policy: [mat for p, mat in mats if p == policy]
    if setup == "llama-twin":
        assert sum(mats_of("fixed:0")) / len(mats_of("fixed:0")) > 2.0
    if setup == "llama-none":
        assert max(mats_of("ucb")) == 1.0
    if setup == "llama-subvocab":  # the mapped twin agrees wherever the context and choice are in its vocabulary
        assert sum(mats_of("fixed:0")) / len(mats_of("fixed:0")) > 1.5


def test_always_wrong_drafter_is_still_lossless(tiny_models) -> None:
    options = LoadOptions()
    model, tokenizer = load_causal_lm(str(tiny_models["llama-target"]), options)
    gen = Generator(model, tokenizer, [AlwaysWrong(model)], policy="fixed:wrong", draft_len=3)
    reference_model = AutoModelForCausalLM.from_pretrained(tiny_models["llama-target"]).eval()
    rng = random.Random(7)
    for _ in range(12):
        prompt = [rng.randrange(2, 40) for _ in range(rng.randint(1, 12))]
        max_new = rng.randint(1, 30)
        result = gen.generate(prompt, max_new_tokens=max_new, ignore_eos=True)
        assert result.token_ids == _reference(reference_model, prompt, max_new, None)
        assert result.stats.accepted == 0 and result.stats.mat == 1.0
        assert all(p == 0.0 for r in result.trace for p in r.accept_probs)


def test_the_verifiers_max_indices_are_argmax_ties_included() -> None:
    """verify_greedy reads ``max(-1).indices`` (cheaper than argmax on CPU): it must be argmax's
    first maximal index, ties included, or greedy output would drift from plain decoding."""
    gen = torch.Generator().manual_seed(0)
    for vocab in (3, 50, 8192):
        tied = torch.randint(0, 3, (64, vocab), generator=gen).float()  # many exact ties
        assert torch.equal(tied.max(-1).indices, tied.argmax(-1))
