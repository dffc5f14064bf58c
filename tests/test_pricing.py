"""Priced lookup drafts: each token's acceptance predicted before the round and learned from the
verdicts, each draft cut to the length that pays at the machine's prices, the output unchanged."""

from __future__ import annotations

import doctest

import pytest

import draftwise.decision.pricing as pricing
import draftwise.models.costs as costs
from draftwise import Generator
from draftwise.decision.pricing import DraftAcceptance, RoundPrices, draft_key, expected_tokens, priced_length
from draftwise.models.costs import CostCurve

# one machine's measured round costs, in plain rounds, by tokens verified: the 4-bit kernel's jump at 5
STEPPED = {1: 1.0, 2: 1.13, 3: 1.19, 4: 1.29, 5: 1.75, 6: 1.81, 7: 1.88, 8: 1.96, 9: 2.42}.__getitem__


def test_docstring_examples_of_pricing() -> None:
    result = doctest.testmod(pricing)
    assert result.failed == 0 and result.attempted > 0


def test_the_length_is_read_off_the_curve_not_its_slope() -> None:
    """Past the curve's jumps a draft must keep nearly all of its tokens to pay: 3 tokens at 0.8,
    7 when nearly every one is accepted (the eighth costs a jump of its own); where the first token
    is a guess, none."""
    assert priced_length([0.8] * 8, STEPPED) == 3
    assert priced_length([0.98] * 8, STEPPED) == 7
    assert priced_length([0.1] * 8, STEPPED) == 0
    flat = lambda n: 1.0 + 0.01 * (n - 1)  # verification nearly free: a GPU's curve
    assert priced_length([0.7] * 8, flat) == 8
    for survival in ([0.8] * 8, [0.9, 0.5, 0.99, 0.99, 0.2, 0.9, 0.9, 0.9]):
        best = max(range(9), key=lambda n: expected_tokens(survival, n) / STEPPED(n + 1))
        assert priced_length(survival, STEPPED, min_gain=0.0) == best  # the exact argmax


def test_acceptance_is_learned_per_key_and_position() -> None:
    book = DraftAcceptance()
    long_match, guess = draft_key(0, 8, 12, 40, True), draft_key(0, 8, 2, 40, True)
    assert long_match != guess and draft_key(0, 8, 12, 3, True) != long_match  # the opening apart
    for _ in range(200):
        book.observe(long_match, drafted=8, accepted=8)
        book.observe(guess, drafted=8, accepted=1)  # the second token always fails
    sure, unsure = book.survival(long_match, 8), book.survival(guess, 8)
    assert min(sure) > 0.95 and unsure[0] > 0.95 and unsure[1] < 0.05
    assert unsure[2] == pytest.approx(pricing.PRIOR, abs=0.2)  # never reached: still the prior's
    assert priced_length(sure, STEPPED) == 7 and priced_length(unsure, STEPPED) == 1


def test_round_prices_follow_the_measured_rounds() -> None:
    prices = RoundPrices(lambda n: 0.010 + 0.001 * (n - 1))
    for _ in range(400):
        prices.observe(0, 0.010)
        prices.observe(8, 0.030)  # measured rounds of 8 drafted tokens cost 5/3 of their forward
    assert prices.cost(9) == pytest.approx(3.0, rel=0.02)
    assert prices.cost(7) == pytest.approx(0.016 * 5 / 3 / 0.010, rel=0.02)  # priced as the nearest measured
    prices.observe(8, 3.0)  # a stall is no cost
    assert prices.cost(9) == pytest.approx(3.0, rel=0.02)


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path))
    monkeypatch.setattr(costs, "_loaded", {})
    return tmp_path


REPEATING = "def fib(n): return fib(n - 1) + fib(n - 2)  # def fib(n): return fib(n - 1) + fib(n - 2)  # def"


class FixedPrices(RoundPrices):
    """Round prices that stay the curve's: the measured rounds of a test machine must not move them."""

    def observe(self, drafted: int, seconds: float) -> None:
        pass


def run(gen: Generator, seconds_per_token: float) -> tuple[list[int], int]:
    """Generate at a curve where each verified token beyond the first costs ``seconds_per_token``
    (of a 10 ms plain forward); the tokens and the draft tokens verified."""
    tokens = {k: 0.010 + seconds_per_token * (k - 1) for k in (1, 2, 4, 8, 16)}
    gen.engine.costs = CostCurve({}, tokens, {1: 0.010, 16: 0.100})
    gen.engine.prices = FixedPrices(gen.engine.costs.forward_s)
    out = gen.generate(REPEATING, max_new_tokens=96, ignore_eos=True)
    return out.token_ids, sum(r.drafted for r in out.trace)


def test_drafts_are_cut_where_verifying_them_costs_more_than_they_keep(home) -> None:
    plain = Generator.from_pretrained("zoo:target", [], policy="fixed", numerics="float32")
    reference = plain.generate(REPEATING, max_new_tokens=96, ignore_eos=True).token_ids
    gen = Generator.from_pretrained("zoo:target", ["pld"], policy="ctx-ucb:follow=1", arms="pld@8,none",
                                    numerics="float32")
    cheap_tokens, cheap_drafted = run(gen, 0.0001)
    dear_tokens, dear_drafted = run(gen, 0.020)  # each drafted token costs two plain steps
    assert cheap_tokens == dear_tokens == reference  # lossless either way
    assert cheap_drafted > 40 and dear_drafted < cheap_drafted / 2
    fixed = Generator.from_pretrained("zoo:target", ["pld"], policy="fixed:pld@8", arms="pld@8,none",
                                      numerics="float32")
    assert fixed.engine.pricing is None  # a fixed configuration drafts as configured


def test_a_loaded_batch_decodes_plainly_where_drafting_does_not_pay(home) -> None:
    """Where, at a load, the tokens a batch admits have earned less than its lanes' drafting and
    choosing took, its rounds there decode plainly — no lookup, no learner — but for every 8th,
    which keeps measuring; where drafting has paid, they draft. Exact either way, a lane's learner
    hears only the rounds it chose, and a Generator's sessions share what the gate measured."""
    plain = Generator.from_pretrained("zoo:target", [], policy="fixed", numerics="float32")
    prompts = [REPEATING, REPEATING[::-1], REPEATING[5:]]
    reference = [r.token_ids for r in plain.generate_batch(prompts, max_new_tokens=48, batch_size=3, ignore_eos=True)]
    gen = Generator.from_pretrained("zoo:target", ["pld", "suffix"], numerics="float32")
    # the test's prices, not this machine's: a token as dear as a plain row (no draft can pay), or a tenth of one
    for earned, gated, token_s in ((0.0, True, 0.010), (1.0, False, 0.001)):
        session = gen.batch_session(3)
        session.engine.prices = FixedPrices(lambda n, token_s=token_s: 0.010 + token_s * (n - 1))
        gate = session.engine.gate
        assert gate is not None  # an exact target that packs its rows, a priced learner with a `none` arm
        for _ in range(gate.need):
            gate.observe(3, earned_s=earned, spent_s=1e-3)
        handles = [session.add(p, max_new_tokens=48, ignore_eos=True) for p in prompts]
        session.run()
        assert [h.result.token_ids for h in handles] == reference
        timing, traces = session.engine.timing, [h.result.trace for h in handles]
        if gated:
            assert timing.gated_rounds >= timing.rounds - timing.rounds // gate.explore - 2  # the tail: fewer rows
            heard = [sum(r.reward is not None for r in trace) for trace in traces]
            assert max(heard) <= timing.rounds - timing.gated_rounds
        else:
            assert timing.gated_rounds == 0
            assert sum(r.drafted for trace in traces for r in trace) > 0
    assert gen.batch_session(2).engine.gate is gate  # what a Generator's sessions learn of their loads, kept
