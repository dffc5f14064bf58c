"""The losslessness checks again with every model on a CUDA device (skipped where there is none).

They run wherever CUDA is available (the last run: BENCHMARKS.md, "GPU").
A tensor built on the CPU that meets a model's CUDA tensors raises, so a stray device shows up as
an error; greedy outputs must equal plain greedy decoding on the same device (a near-tie of the
target's two best logits the only tolerated reason, as in ``test_batch``).
"""

from __future__ import annotations

import random

import pytest
import torch
from test_batch import SETUPS, _spec, assert_exact

from draftwise import Generator
from draftwise.drafters import build_drafters
from draftwise.models.loading import LoadOptions, load_causal_lm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _generator(tiny_models, target: str, specs: list[str], policy: str) -> Generator:
    cuda = LoadOptions(device="cuda")  # made in the test: without a CUDA device, options naming one are refused
    model, tokenizer = load_causal_lm(str(tiny_models[target]), cuda)
    pool = build_drafters([_spec(tiny_models, s) for s in specs], model, tokenizer, cuda)
    return Generator(model, tokenizer, pool, policy=policy)


@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_single_and_batched_queries_on_cuda_are_plain_greedy(tiny_models, setup: str) -> None:
    target, specs, policy, decide = SETUPS[setup]
    gen = _generator(tiny_models, target, specs, policy)
    assert next(gen.model.parameters()).device.type == "cuda"
    rng = random.Random(setup)
    vocab = gen.target.vocab_size
    text_like = [rng.randrange(1, vocab) for _ in range(12)]
    prompts = [(text_like * 4)[: rng.choice([5, 17, 40])] if i % 2 else
               [rng.randrange(1, vocab) for _ in range(rng.choice([2, 17]))] for i in range(6)]
    for prompt in prompts[:3]:
        result = gen.generate(prompt, max_new_tokens=24, ignore_eos=True)
        assert_exact(gen.model, prompt, result.token_ids, 24, frozenset(), f"{setup} alone")
    results = gen.generate_batch(prompts, max_new_tokens=24, batch_size=4, decide=decide, ignore_eos=True)
    for prompt, result in zip(prompts, results):
        assert result.error is None, result.error
        assert_exact(gen.model, prompt, result.token_ids, 24, frozenset(), f"{setup} batched")
    sampled = gen.generate_batch(prompts[:3], max_new_tokens=16, temperature=0.8, top_p=0.9, seed=[1, 2, 3],
                                 batch_size=3, decide=decide, ignore_eos=True)
    assert all(r.error is None and len(r.token_ids) == 16 for r in sampled)
    # coupled sampling (the default): one seed, one text — the plain decoding's, alone or batched
    plain = Generator(gen.model, gen.tokenizer, [], policy="fixed")
    want = [plain.generate(p, max_new_tokens=16, temperature=0.8, top_p=0.9, seed=s, ignore_eos=True).token_ids
            for p, s in zip(prompts[:3], [1, 2, 3])]
    assert [r.token_ids for r in sampled] == want


def test_the_zoo_on_cuda() -> None:
    gen = Generator.from_pretrained("zoo:target", ["zoo:all", "pld", "suffix"], device="cuda")
    prompts = ["Write a Python function that returns the square of a number.",
               "Translate to French: The cat sleeps on the warm windowsill.",
               "What is 17 times 23? Think step by step."]
    ids = [gen.encode(p) for p in prompts]
    for prompt in ids:
        result = gen.generate(prompt, max_new_tokens=48, ignore_eos=True)
        assert_exact(gen.model, prompt, result.token_ids, 48, frozenset(), "zoo alone")
    for prompt, result in zip(ids, gen.generate_batch(ids, max_new_tokens=48, batch_size=3, ignore_eos=True)):
        assert_exact(gen.model, prompt, result.token_ids, 48, frozenset(), "zoo batched")
    for policy in ("hedgespec", "metasd-ucb", "banditspec-length"):
        other = Generator(gen.model, gen.tokenizer, gen.drafters, policy=policy)
        result = other.generate(ids[0], max_new_tokens=48, ignore_eos=True)
        assert_exact(gen.model, ids[0], result.token_ids, 48, frozenset(), f"zoo {policy}")


def test_the_coupled_noise_is_the_same_on_cuda() -> None:
    """The noise is hashed where the scores are: the same uniforms bit for bit on the GPU, the same
    Gumbel values up to the last bits of float32's log."""
    from draftwise.verify.coupling import gumbel_rows, noise_keys, uniforms

    keys = [noise_keys(seed, position) for seed in (0, 9) for position in (0, 5, 4000)]
    assert torch.equal(uniforms(keys, 8000, "cuda").cpu(), uniforms(keys, 8000))
    assert torch.allclose(gumbel_rows(keys, 8000, "cuda").cpu(), gumbel_rows(keys, 8000), rtol=1e-5, atol=1e-6)
