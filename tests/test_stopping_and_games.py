"""Stopping rules stop exactly where their formulas say; token- and chunk-level games agree."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from draftwise.drafters import DraftContext, LMDrafter, make_stop_rule
from draftwise.drafters.stopping import LineFit, RoundCostFit, adaedl_threshold, draft_pays, entropy
from draftwise.policies.delayed import TokenGame
from draftwise.policies.feedback import acceptance_loss

V = 6


def _dist(top: float, second: float) -> torch.Tensor:
    rest = (1.0 - top - second) / (V - 2)
    return torch.tensor([top, second] + [rest] * (V - 2))


# A scripted sequence of drafter distributions, one per draft position.
SCRIPT = [_dist(0.97, 0.01), _dist(0.9, 0.05), _dist(0.85, 0.1), _dist(0.6, 0.35), _dist(0.5, 0.1), _dist(0.99, 0.002)]


class ScriptedLM:
    """Stands in for a cached LM: returns the scripted distribution of each position as logits."""

    def __init__(self) -> None:
        self.step = 0
        self.tokens: list[int] = []
        self.vocab_size = V

    def logits(self, tokens, n_out=1):
        self.step = 0
        return torch.log(SCRIPT[0])[None]

    def extend(self, new, n_out=1):
        self.step += 1
        return torch.log(SCRIPT[self.step])[None]


def _drafted(rule_spec: str) -> int:
    return _drafted_with(make_stop_rule(rule_spec))


def _first_stop(condition) -> int:
    """Tokens drafted: the first position ≥ 1 whose distribution meets the stop condition."""
    return next((j for j in range(1, len(SCRIPT)) if condition(j)), len(SCRIPT))


def test_static_drafts_the_whole_budget() -> None:
    assert _drafted("static") == len(SCRIPT)


@pytest.mark.parametrize("h", [0.8, 0.88, 0.95])
def test_max_confidence(h: float) -> None:
    assert _drafted(f"max-confidence:h={h}") == _first_stop(lambda j: float(SCRIPT[j].max()) < h)


@pytest.mark.parametrize("h", [0.6, 0.8, 1.0])
def test_svip(h: float) -> None:
    assert _drafted(f"svip:h={h}") == _first_stop(lambda j: math.sqrt(entropy(SCRIPT[j])) > h)


@pytest.mark.parametrize("h", [0.05, 0.2, 0.3])
def test_svip_difference(h: float) -> None:
    roots = [math.sqrt(entropy(p)) for p in SCRIPT]
    assert _drafted(f"svip-difference:h={h}") == _first_stop(lambda j: roots[j] - roots[j - 1] > h)


@pytest.mark.parametrize("h", [0.2, 0.5, 0.9])
def test_logit_margin(h: float) -> None:
    def margin(j: int) -> float:
        top = torch.topk(SCRIPT[j], 2).values
        return float(top[0] - top[1])

    assert _drafted(f"logit-margin:h={h}") == _first_stop(lambda j: margin(j) < h)


@pytest.mark.parametrize("lam", [0.2, 0.4, 0.6])
def test_adaedl_stops_below_its_bound_and_adapts(lam: float) -> None:
    expected = _first_stop(lambda j: 1 - math.sqrt(entropy(SCRIPT[j])) < lam)
    assert _drafted(f"adaedl:lam={lam}") == expected
    rule = make_stop_rule(f"adaedl:lam={lam},target=0.8,beta1=0.5,beta2=0.9,eps=0.01")
    rule.after_round(drafted=4, accepted=1)  # rate 0.25 < 0.8: λ rises (stop earlier)
    assert rule.rate == pytest.approx(0.5 * 0.8 + 0.5 * 0.25)
    assert rule.lam == pytest.approx(adaedl_threshold(lam, rule.rate, 0.8, 0.9, 0.01))
    assert rule.lam > lam
    rule.lam = lam
    rule.rate = 0.95
    rule.after_round(drafted=4, accepted=4)  # above target: λ falls
    assert rule.lam < lam


def test_heuristic_follows_transformers_schedule() -> None:
    """+up after a fully accepted draft, −down (not below 1) otherwise; the drafter honours the length."""
    assert _drafted("heuristic:start=3") == 3
    rule = make_stop_rule("heuristic")  # start 4, +2 / −1 as transformers' "heuristic" schedule
    rule.after_round(drafted=4, accepted=4)
    assert rule.k == 6
    for _ in range(9):
        rule.after_round(drafted=rule.k, accepted=0)
    assert rule.k == 1
    rule.after_round(drafted=0, accepted=0)  # nothing drafted: no evidence either way
    assert rule.k == 1
    assert [rule.should_stop(SCRIPT[0], step) for step in (0, 1)] == [False, True]
    with pytest.raises(Exception, match="start ≥ 1"):
        make_stop_rule("heuristic:start=0")


def test_gain_drafts_while_the_expected_rate_rises_and_learns_costs_and_calibration() -> None:
    """The expected-throughput rule: long drafts while the drafter is sure and verifying is cheap,
    the first doubtful token stops them once verification is dear; it learns both from rounds."""
    assert draft_pays(1.0, 1.0, 0.9, 1, lambda n: 0.005)
    assert not draft_pays(1.0, 1.0, 0.05, 1, lambda n: 0.005 + 0.004 * n)
    cheap = make_stop_rule("gain")
    cheap.costs.draft, cheap.costs.verify = LineFit(1e-4, 1e-5, 1, 1), LineFit(5e-3, 1e-5, 1, 1)  # a GPU at batch 1
    assert _drafted_with(cheap) == len(SCRIPT)  # every token is worth its (tiny) cost
    dear = make_stop_rule("gain")
    dear.costs.draft, dear.costs.verify = LineFit(1e-3, 2e-3, 1, 1), LineFit(5e-3, 2e-3, 1, 1)  # dear per token
    assert 1 <= _drafted_with(dear) < len(SCRIPT)
    # calibration: a confident drafter that is always rejected stops being believed
    rule = make_stop_rule("gain")
    before = rule.hits / rule.tries
    for _ in range(30):
        rule.start_draft()
        for step in range(3):
            rule.should_stop(SCRIPT[0], step)
        rule.after_round(drafted=3, accepted=0)
    after = rule.hits / rule.tries
    top = rule._bin(float(SCRIPT[0].max()))
    assert after[top] < 0.1 < before[top]
    # costs: the fit follows what the rounds measure (drafting 1 + 2 ms per token, verifying 4 + 1 ms per token)
    fit = RoundCostFit()
    for n in [1, 2, 3, 4, 5, 6] * 40:
        fit.add(n, 0.001 + 0.002 * n, 0.004 + 0.001 * n)
    assert fit.base_s == pytest.approx(0.005, rel=0.05) and fit.per_token_s == pytest.approx(0.003, rel=0.05)
    with pytest.raises(Exception, match="bins ≥ 1"):
        make_stop_rule("gain:bins=0")


def _drafted_with(rule) -> int:
    """Tokens the scripted drafter drafts under ``rule``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tiny = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                        num_attention_heads=1, num_key_value_heads=1))
    drafter = LMDrafter(tiny, name="scripted")
    drafter.lm = ScriptedLM()
    return len(drafter.propose([1, 2], len(SCRIPT), DraftContext(), rule).tokens)


def test_a_lasting_rule_is_kept_across_queries(tiny_models) -> None:
    from draftwise import Generator

    gen = Generator.from_pretrained(str(tiny_models["llama-target"]), [str(tiny_models["llama-near"])],
                                    policy="fixed:0", arms="llama-near@6+gain")
    gen.generate([5, 6, 7, 8, 9, 5, 6, 7], max_new_tokens=20, ignore_eos=True)
    rule = gen.engine.last_query.rules[0]
    seen = float(rule.tries.sum())
    gen.generate([9, 8, 7, 6, 5, 9, 8, 7], max_new_tokens=20, ignore_eos=True)
    assert gen.engine.last_query.rules[0] is rule and float(rule.tries.sum()) > seen


def test_token_and_chunk_games_see_the_same_total_acceptance_loss() -> None:
    rng = np.random.default_rng(0)
    arms, total = 4, 0
    game = TokenGame(arms, depth=5, kind="accept")
    chunk_total = np.zeros(arms)
    token_total = np.zeros(arms)
    for _ in range(30):  # a fixed trajectory of rounds with 1..6 verified positions each
        gammas = rng.uniform(size=(arms, int(rng.integers(1, 7))))
        chunk_total += acceptance_loss(gammas) * gammas.shape[1]  # the chunk loss is a per-round mean
        for losses in game.add(gammas):
            token_total += losses
        total += gammas.shape[1]
    np.testing.assert_allclose(token_total, chunk_total, rtol=1e-12)
    assert total > 30
