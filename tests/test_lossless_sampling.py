"""Sampling losslessness: speculative sampling draws from exactly the target's distribution,
under both schemes (coupled Gumbel-max, the default, and classic rejection sampling).

With a 5-token vocabulary the joint distribution of the first three generated tokens (125 cells)
is computed exactly from the target, then compared with draws from the engine by a chi-square
test at fixed seeds. A negative control shows the test rejects a sampler that is off.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from draftwise import Generator
from draftwise.drafters import Draft, Drafter, LMDrafter, PromptLookupDrafter, SuffixDrafter
from draftwise.models.vocab_map import VocabMap, attach_vocab_map
from draftwise.verify.chain import Sampling, warp

VOCAB = 5
NEW = 3
DRAWS = 2000
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]


def _model(seed: int, layers: int, vocab: int = VOCAB) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         initializer_range=0.3, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(config).eval()


class RandomPointMass(Drafter):
    """Proposes uniformly random tokens: frequent rejections exercise the residual path."""

    name = "noise"

    def propose(self, context, max_len, ctx, stop=None):
        return Draft(torch.randint(VOCAB, (max_len,), generator=ctx.generator).tolist())


@torch.inference_mode()
def exact_joint(model, sampling: Sampling) -> np.ndarray:
    probs = np.zeros([VOCAB] * NEW)
    for seq in itertools.product(range(VOCAB), repeat=NEW):
        ids = torch.tensor([PROMPT + list(seq[:-1])])
        logits = model(ids).logits[0, len(PROMPT) - 1 :].float()
        p = warp(logits, sampling)
        probs[seq] = float(np.prod([p[j, seq[j]].item() for j in range(NEW)]))
    return probs


def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson chi-square p-value; cells expected below 5 draws are pooled into one."""
    counts, expected = counts.ravel(), probs.ravel() * counts.sum()
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64)))


def _draws(gen: Generator, sampling: Sampling) -> np.ndarray:
    counts = np.zeros([VOCAB] * NEW)
    for seed in range(DRAWS):
        out = gen.generate(PROMPT, max_new_tokens=NEW, temperature=sampling.temperature, top_k=sampling.top_k,
                           top_p=sampling.top_p, seed=seed, ignore_eos=True)
        counts[tuple(out.token_ids)] += 1
    return counts


def _subvocab_drafter() -> LMDrafter:
    """A drafter over target ids 0, 2 and 4 only (its fourth id stands for 1 and 3)."""
    model = _model(12, 1, vocab=4)
    attach_vocab_map(model, VocabMap([0, 2, 4], VOCAB))
    return LMDrafter(model, name="subvocab")


DRAFTERS = {
    "lm": lambda: LMDrafter(_model(11, 1), name="lm"),
    "lm-subvocab": _subvocab_drafter,
    "pld": lambda: PromptLookupDrafter(),
    "suffix": lambda: SuffixDrafter(min_prob=0.0, factor=4.0),
    "noise": lambda: RandomPointMass(),
}


@pytest.fixture(scope="module")
def target():
    return _model(3, 2)


SCHEMES = ("coupled", "rejection")  # Gumbel-max with per-position noise; classic speculative sampling


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("kind", sorted(DRAFTERS))
def test_first_tokens_follow_the_target(target, kind: str, scheme: str) -> None:
    sampling = Sampling(temperature=1.0)
    gen = Generator(target, None, [DRAFTERS[kind]()], policy="fixed:0", draft_len=3, sampling=scheme)
    counts = _draws(gen, sampling)
    p_value = chi_square_p(counts, exact_joint(target, sampling))
    assert p_value > 1e-3, f"{kind}: p = {p_value:.2e}"


@pytest.mark.parametrize("scheme", SCHEMES)
def test_warped_sampling_with_a_pool(target, scheme: str) -> None:
    sampling = Sampling(temperature=0.8, top_k=4, top_p=0.9)
    pool = [DRAFTERS["lm"](), DRAFTERS["pld"](), DRAFTERS["noise"]()]
    gen = Generator(target, None, pool, policy="random", draft_len=2, sampling=scheme)
    counts = _draws(gen, sampling)
    assert chi_square_p(counts, exact_joint(target, sampling)) > 1e-3


def test_the_test_rejects_the_drafters_own_distribution(target) -> None:
    """Negative control: drawing from the LM drafter instead of the target must fail the test."""
    sampling = Sampling(temperature=1.0)
    drafter_model = _model(11, 1)
    counts = _draws(Generator(drafter_model, None, [], policy="ucb"), sampling)
    assert chi_square_p(counts, exact_joint(target, sampling)) < 1e-3


def test_warp_matches_transformers_processors() -> None:
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 3
    for temperature, top_k, top_p in [(1.0, None, None), (0.7, 10, None), (1.3, None, 0.8), (0.5, 5, 0.6)]:
        scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
        if top_k:
            scores = TopKLogitsWarper(top_k)(None, scores)
        if top_p:
            scores = TopPLogitsWarper(top_p)(None, scores)
        expected = torch.softmax(scores, -1)
        got = warp(logits, Sampling(temperature, top_k, top_p))
        assert torch.allclose(got, expected, atol=1e-6), (temperature, top_k, top_p)
