"""KV caches stay exact: after accept/reject sequences and drafter switches, logits from the
cache equal those of a fresh prefill of the same tokens."""

from __future__ import annotations

import random
import warnings

import numpy as np
import torch

from draftwise import Generator
from draftwise.drafters import LMDrafter, build_drafters
from draftwise.models.cached_lm import CachedLM, cache_keyword, common_prefix_len
from draftwise.models.loading import LoadOptions, load_causal_lm
from draftwise.policies.simple import RandomPolicy

TOL = 1e-4


@torch.inference_mode()
def _fresh_next_logits(model, tokens: list[int]) -> torch.Tensor:
    return model(torch.tensor([tokens])).logits[0, -1].float()


def _assert_cache_exact(lm: CachedLM, probe: int) -> None:
    """Feed one probe token through the cache and compare with a fresh prefill."""
    tokens = list(lm.tokens)
    cached = lm.logits(tokens + [probe], 1)[0]
    fresh = _fresh_next_logits(lm.model, tokens + [probe])
    assert torch.allclose(cached, fresh, atol=TOL), float((cached - fresh).abs().max())


def test_random_accept_reject_sequences(tiny_models) -> None:
    model, _ = load_causal_lm(str(tiny_models["gpt2-target"]), LoadOptions())
    lm = CachedLM(model)
    rng = random.Random(0)
    tokens = [rng.randrange(2, 40) for _ in range(5)]
    for step in range(60):
        draft = [rng.randrange(2, 40) for _ in range(rng.randint(0, 6))]
        lm.logits(tokens + draft, len(draft) + 1)  # verify a draft
        accepted = rng.randint(0, len(draft))
        tokens = tokens + draft[:accepted] + [rng.randrange(2, 40)]  # accept a prefix + one token
        if step % 7 == 6:  # occasionally probe from an older point (a drafter that was idle)
            lm.logits(tokens[: rng.randint(1, len(tokens))], 1)
        probe = rng.randrange(2, 40)
        cached = lm.logits(tokens + [probe], 1)[0]
        assert torch.allclose(cached, _fresh_next_logits(model, tokens + [probe]), atol=TOL)
        assert lm.tokens == tokens + [probe]


def test_caches_after_drafter_switches(tiny_models) -> None:
    options = LoadOptions()
    model, tokenizer = load_causal_lm(str(tiny_models["llama-target"]), options)
    specs = [str(tiny_models[n]) for n in ("llama-near", "llama-small", "llama-twin")] + ["pld"]
    pool = build_drafters(specs, model, tokenizer, options)
    checked = []

    class CheckingPolicy(RandomPolicy):
        """Random switching; after every round every cache must match a fresh prefill."""

        def observe(self, arm: int, reward: float) -> None:
            for lm in [gen.target] + [d.lm for d in pool if isinstance(d, LMDrafter)]:
                if lm.tokens:
                    before = list(lm.tokens)
                    cached = lm.logits(before, 1)[0]  # already cached: re-feeds only the last token
                    assert torch.allclose(cached, _fresh_next_logits(lm.model, before), atol=TOL)
            checked.append(arm)

    # float32 drafter heads: the lean path then matches a fresh transformers prefill to 1e-4
    gen = Generator(model, tokenizer, pool, policy="random", draft_len=4, drafter_head_dtype="float32")
    gen.policy = gen.engine.policy = CheckingPolicy([a.name for a in gen.arms], np.random.default_rng(0))
    for seed in range(4):
        gen.generate([5, 6, 7, 8, 5, 6, 7] * (seed + 1), max_new_tokens=40, seed=seed, ignore_eos=True)
    assert len(set(checked)) == len(pool)  # every drafter was played, so switches happened
    for lm in [gen.target] + [d.lm for d in pool if isinstance(d, LMDrafter)]:
        _assert_cache_exact(lm, 9)


def test_idle_drafter_catches_up_without_full_prefill(tiny_models) -> None:
    options = LoadOptions()
    model, tokenizer = load_causal_lm(str(tiny_models["llama-target"]), options)
    drafter = build_drafters([str(tiny_models["llama-near"])], model, tokenizer, options)[0]
    seen: list[int] = []
    original = drafter.lm._forward

    def counting(fresh, n_out):
        seen.append(len(fresh))
        return original(fresh, n_out)

    drafter.lm._forward = counting
    context = list(range(2, 30))
    drafter.propose(context, 3, _ctx())
    seen.clear()
    drafter.propose(context + [5, 6, 7, 8, 9], 3, _ctx())  # idle for 5 tokens, then drafts again
    assert seen[0] <= 5 + 1  # the unseen tokens (plus at most the re-fed last one), not 33


def _ctx():
    from draftwise.drafters import DraftContext

    return DraftContext()


def test_common_prefix_len() -> None:
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix_len([1, 2, 3, 4], [1, 2, 5, 4]) == 2
    rng = random.Random(1)
    for _ in range(500):  # long enough for the search back from the end to take several steps
        a = [rng.randrange(3) for _ in range(rng.randint(0, 80))]
        b = a[: rng.randint(0, len(a))] + [rng.randrange(3) for _ in range(rng.randint(0, 12))]
        if rng.random() < 0.5:
            a, b = b, a
        expected = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert common_prefix_len(a, b) == expected


def test_the_cache_goes_by_the_name_the_model_takes(tiny_models) -> None:
    """transformers renamed ``past_key_values`` to ``cache`` (the old name warns, then goes in 5.40):
    each model gets the name its forward takes, so neither single nor batched decoding warns."""

    class Old(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, past_key_values: object = None) -> None: ...

    class New(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, cache: object = None, **kwargs: object) -> None: ...

    assert cache_keyword(Old()) == "past_key_values" and cache_keyword(New()) == "cache"
    model, tokenizer = load_causal_lm(str(tiny_models["llama-target"]), LoadOptions())
    gen = Generator(model, tokenizer, build_drafters(["pld"], model, tokenizer, LoadOptions()), policy="fixed")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*")
        gen.generate([1, 2, 3, 1, 2, 3], max_new_tokens=6, ignore_eos=True)
        gen.generate_batch([[1, 2, 3], [4, 5, 6, 4, 5]], max_new_tokens=6, ignore_eos=True)
