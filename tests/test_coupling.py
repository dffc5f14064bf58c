"""Coupled sampling (the default scheme): one seed gives one text, whatever drafted it.

The distribution tests live with the other sampling tests (``test_lossless_sampling``,
``test_trees``: both schemes). Here: a sampled generation equals plain decoding with the same seed
token for token — for LM chains, lookups, sampled and dynamic trees, learning policies that keep
state across calls and learn from the clock, alone or in a batch — while under rejection sampling
it does not (the property is not free), and the noise itself is stable.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from test_batch import _generator, _spec

from draftwise import Generator
from draftwise.errors import DraftwiseError
from draftwise.verify.chain import Sampling, acceptance_probs, verify_greedy, warp
from draftwise.verify.coupling import (
    DrawJob,
    NoiseScreen,
    PositionNoise,
    acceptance_given_noise,
    coupled_draws,
    coupled_scores,
    gumbel_row,
    noise_keys,
    noise_rows,
    uniforms,
    uniforms_torch,
)

POOLS = {
    # name: (drafters, policy, arms)
    "lm-chain": (["llama-near", "llama-small"], "ucb", None),
    "lookups-default": (["pld", "suffix", "llama-near"], "ctx-ucb", None),  # keeps state, learns from the clock
    "sampled-tree": (["lm:model=llama-near,tree=sampled,shape=2x2x1", "pld"], "hedgespec", None),
    "dynamic-tree": (["lm:model=llama-near,tree=dynamic,topk=2,budget=6"], "fixed:0", None),
    "union-gain": (["pld", "suffix", "llama-near"], "ctx-ucb:on=pld+suffix", "pld|suffix@8,auto@8+gain,none"),
}


def _prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(5)
    motif = [rng.randrange(1, vocab) for _ in range(6)]
    return [(motif * 5)[:23], [rng.randrange(1, vocab) for _ in range(9)], (motif * 3)[:14]]


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_the_seed_decides_the_text(tiny_models, pool: str) -> None:
    specs, policy, arms = POOLS[pool]
    gen = _generator(tiny_models, "llama-target", [_spec(tiny_models, s) for s in specs], policy, arms=arms)
    plain = Generator(gen.model, gen.tokenizer, [], policy="fixed")
    prompts = _prompts(gen.target.vocab_size)
    kw = dict(max_new_tokens=40, temperature=0.9, top_p=0.95, ignore_eos=True)
    accepted = 0
    for seed in (1, 2):
        want = [plain.generate(p, seed=seed, **kw).token_ids for p in prompts]
        for _ in range(3):  # the same Generator again: its learner has moved on, the text must not
            got = [gen.generate(p, seed=seed, **kw) for p in prompts]
            assert [r.token_ids for r in got] == want
            accepted += sum(r.stats.accepted for r in got)
        batched = gen.generate_batch(prompts, seed=seed, batch_size=2, **kw)
        assert [r.token_ids for r in batched] == want
    assert accepted > 0  # drafts were really accepted (not a run of plain steps)


def test_rejection_sampling_texts_depend_on_the_drafts(tiny_models) -> None:
    """The control: classic speculative sampling draws the same distribution, not the same text."""
    gen = _generator(tiny_models, "llama-target", [str(tiny_models["llama-near"])], "fixed:0", sampling="rejection")
    plain = Generator(gen.model, gen.tokenizer, [], policy="fixed", sampling="rejection")
    prompts = _prompts(gen.target.vocab_size)
    kw = dict(max_new_tokens=40, temperature=0.9, ignore_eos=True)
    same = [gen.generate(p, seed=s, **kw).token_ids == plain.generate(p, seed=s, **kw).token_ids
            for p in prompts for s in range(3)]
    assert not all(same)


def test_the_noise_is_fixed_by_seed_and_position() -> None:
    assert torch.equal(gumbel_row(7, 100, 50), gumbel_row(7, 100, 80)[:50])  # prefix-stable
    assert not torch.equal(gumbel_row(7, 100, 50), gumbel_row(7, 101, 50))
    assert not torch.equal(gumbel_row(7, 100, 50), gumbel_row(8, 100, 50))
    # standard Gumbel: mean ≈ Euler–Mascheroni 0.5772, variance π²/6
    big = gumbel_row(1, 0, 200_000).double()
    assert abs(float(big.mean()) - 0.5772) < 0.01 and abs(float(big.var()) - np.pi ** 2 / 6) < 0.03
    noise = PositionNoise(7, "cpu")
    assert torch.equal(noise.row(100, 50), gumbel_row(7, 100, 50))
    assert noise.rows([3, 4], 10).shape == (2, 10)
    noise.forget_before(4)
    assert sorted(noise._rows) == [4, 100]


def test_the_noise_is_the_same_bits_on_every_device_path() -> None:
    """The CPU draws with numpy, other devices with torch: the same integer hash, the same floats."""
    keys = [noise_keys(seed, position) for seed in (0, 7, 2**63 + 5) for position in (0, 1, 999)]
    assert torch.equal(uniforms(keys, 3000), uniforms_torch(keys, 3000, torch.device("cpu")))
    u = uniforms(keys, 3000)
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    # neighbouring positions and seeds are uncorrelated
    flat = u.double() - 0.5
    corr = torch.corrcoef(flat)
    assert float((corr - torch.eye(len(keys), dtype=corr.dtype)).abs().max()) < 0.08


def test_rows_drawn_together_equal_rows_drawn_one_by_one() -> None:
    a, b = PositionNoise(3, "cpu"), PositionNoise(4, "cpu")
    a.row(11, 20)  # drawn narrower before: redrawn wider
    stacked = noise_rows([(a, [10, 11, 12]), (b, [10])], 40)
    expected = torch.stack([gumbel_row(3, 10, 40), gumbel_row(3, 11, 40), gumbel_row(3, 12, 40), gumbel_row(4, 10, 40)])
    assert torch.equal(stacked, expected)
    assert torch.equal(a.row(12, 40), expected[2])


def test_a_batch_of_coupled_draws_equals_each_query_drawn_alone() -> None:
    """What a batched round decides for its sampled lanes at once equals judging each lane alone."""
    gen = torch.Generator().manual_seed(0)
    settings = [Sampling(0.7, coupled=True), Sampling(1.2, top_k=5, coupled=True),
                Sampling(0.9, top_p=0.8, coupled=True)]
    jobs = []
    for i in range(7):
        n = i % 4
        logits = torch.randn(n + 1, 50, generator=gen) * 3
        draft = torch.randint(0, 50, (n,), generator=gen).tolist()
        jobs.append(DrawJob(PositionNoise(100 + i, "cpu"), 5 + i, draft, logits, settings[i % 3]))
    for job, draw in zip(jobs, coupled_draws(jobs)):
        probs = warp(job.logits, job.sampling)
        noise = PositionNoise(job.noise.seed, "cpu").rows(range(job.start, job.start + len(job.draft) + 1), 50)
        alone = verify_greedy(job.draft, coupled_scores(probs, noise))
        assert draw.choices == coupled_scores(probs, noise).max(-1).indices.tolist()
        assert verify_greedy(job.draft, job.logits, draw.choices).accepted == alone.accepted
        assert draw.accept_probs == pytest.approx(acceptance_probs(job.draft, probs, None).tolist())
        assert torch.allclose(draw.probs, probs)


def test_an_unknown_scheme_is_one_clear_error(tiny_models) -> None:
    with pytest.raises(DraftwiseError, match="sampling must be one of coupled, rejection"):
        _generator(tiny_models, "llama-target", ["pld"], "fixed:0", sampling="gumbel")


def test_the_noise_screen_cuts_lookup_drafts_without_changing_the_text(tiny_models) -> None:
    """A lookup's token is accepted iff it is the target's Gumbel-max, and its own noise is known
    before the forward: the screen cuts where it predicts a rejection. Same text, fewer rejected tokens."""
    def run(screen: bool) -> tuple[list[list[int]], int, int]:
        gen = _generator(tiny_models, "llama-target", ["pld"], "fixed:0")
        if not screen:
            gen.engine.noise_screen = None
        prompts = _prompts(gen.target.vocab_size)
        results = [gen.generate(p, seed=seed, max_new_tokens=40, temperature=0.9, ignore_eos=True)
                   for seed in (1, 2, 3) for p in prompts]
        drafted = sum(r.stats.drafted for r in results)
        accepted = sum(r.stats.accepted for r in results)
        return [r.token_ids for r in results], drafted, accepted

    texts, drafted, accepted = run(screen=True)
    texts_off, drafted_off, accepted_off = run(screen=False)
    assert texts == texts_off
    assert drafted - accepted < drafted_off - accepted_off  # fewer tokens drafted only to be rejected
    assert drafted < drafted_off


def test_the_noise_screen_learns_from_verdicts() -> None:
    screen = NoiseScreen(explore=0)
    assert screen.cut([-2.0]) == 0  # the prior (p = ½): a token at γ = −2 wins 2 % of the time
    for _ in range(40):
        screen.observe([-2.0, 0.0], accepted=2)  # a target sure of what the lookup copies
    assert screen.cut([-2.0]) == 1
    assert screen.rate(0.0) > acceptance_given_noise(0.0)
    screen.observe([0.7, 0.7, 0.7], accepted=1)  # judged: the first (accepted) and the second (rejected)
    assert screen.judged[4] == 2.0 + 2 and screen.accepted[4] == 2.0 * acceptance_given_noise(0.75) + 1
