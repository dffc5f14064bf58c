"""The decision core on its own: choices under a batch's limits, contexts, feedback, plain-round
credit, the warm start, the load's limits and the batch-level learners (no model, no clock)."""

from __future__ import annotations

import numpy as np
import pytest

from draftwise.decision.arms import Arm
from draftwise.decision.core import (
    NO_LIMITS,
    ArmBook,
    Choice,
    Limits,
    LoadLearners,
    QueryDecider,
    arm_book,
    copy_learner,
    limits_at,
    load_limits,
    make_learner,
    warm_start,
)
from draftwise.decision.step_costs import StepCostModel, length_cap
from draftwise.drafters import PromptLookupDrafter, SuffixDrafter
from draftwise.policies import make_policy
from draftwise.trace import RoundRecord

NAMES = ("pld@8", "model@4", "none")
# a lookup (watched), a model drafter, no speculation
BOOK = ArmBook(names=NAMES, lengths=(8, 4, 0), none=2, drafting=frozenset({0, 1}), models=frozenset({1}),
               watched=(0,), lookups_only=False)


def _policy(spec: str, names: tuple[str, ...] = NAMES, seed: int = 0):
    return make_policy(spec, list(names), np.random.default_rng(seed))


def _record(arm: int, emitted: int, index: int = 0) -> RoundRecord:
    return RoundRecord(index=index, arm=arm, arm_name=NAMES[arm], max_draft=8, drafted=emitted - 1,
                       accepted=emitted - 1, emitted=emitted, position=index, verify_s=0.01)


def test_the_arm_book_reads_the_arms_and_the_watched_lookups() -> None:
    drafters = [PromptLookupDrafter(), SuffixDrafter()]
    arms = [Arm("suffix/pld@8", 1, 8, also=(0,), pick=True), Arm("pld@4", 0, 4), Arm("none", None, 0)]
    book = arm_book(arms, drafters, ("suffix", "pld"))
    assert (book.none, book.drafting, book.models, book.watched, book.lookups_only) == (
        2, frozenset({0, 1}), frozenset(), (1, 0), True)
    assert (book.longest, book.longest_model) == (8, 0)
    assert arm_book(arms, drafters, ("gone",)).watched == ()  # no watched drafter in the pool: no context
    assert arm_book(arms, drafters, ("suffix", "gone")).watched == (1, None)
    assert not arm_book(arms, drafters, ("suffix",)).lookups_only  # pld@4 drafts with an unwatched lookup
    learner = make_learner("ctx-ucb", arms, drafters, np.random.default_rng(0))
    assert learner.context_on == ("suffix", "pld")


def test_a_learner_that_can_skips_blocked_arms_the_others_play_none() -> None:
    limits = Limits(8, blocked=frozenset({1}))
    ucb = QueryDecider(BOOK, _policy("ucb:prior=0.5/0.9/0.2"))  # it would play the model arm
    assert ucb.choose([3], 0, NO_LIMITS) == Choice(1, (True,))
    assert ucb.choose([3], 0, limits) == Choice(0, (True,))  # the next best, not none
    assert "blocked" not in vars(ucb.policy)  # told for one selection, nothing left on the learner
    rolling = QueryDecider(BOOK, _policy("round-robin"))
    rolling.policy.t = 1  # its turn for the model arm
    assert rolling.choose([0], 0, limits) == Choice(2, (False,))  # it cannot skip: none instead
    every = Limits(0, blocked=BOOK.drafting)
    assert QueryDecider(BOOK, _policy("ucb:prior=0.9/0.9/0.1")).choose([5], 0, every).arm == 2


def test_without_none_a_blocked_arm_is_played_or_left_unheard() -> None:
    book = ArmBook(names=NAMES[:2], lengths=(8, 4), none=None, drafting=frozenset({0, 1}), models=frozenset({1}),
                   watched=(), lookups_only=False)
    blocked = Limits(8, blocked=frozenset({1}))
    fixed = _policy("fixed:1", NAMES[:2])
    assert QueryDecider(book, fixed).choose([], 0, blocked) == Choice(1)  # the engine: the round is played
    assert QueryDecider(book, fixed, hear_idle=False).choose([], 0, blocked) is None  # vLLM: a plain step


def test_a_round_where_no_arm_can_draft_need_not_reach_the_learner() -> None:
    book = ArmBook(names=("pld@8", "none"), lengths=(8, 0), none=1, drafting=frozenset({0}), models=frozenset(),
                   watched=(0,), lookups_only=True)
    quiet = QueryDecider(book, _policy("ctx-ucb:on=pld", ("pld@8", "none")), hear_idle=False)
    assert quiet.choose([0], 5) is None and quiet.policy.key is None  # no context set, nothing chosen
    assert quiet.choose([2], 5) is not None
    heard = QueryDecider(book, _policy("ctx-ucb:on=pld", ("pld@8", "none")))
    assert heard.choose([0], 5) == Choice(1, (False,))  # the rule prior leads with none


def test_the_context_holds_the_load_bucket_when_asked_and_an_imposed_arm_keeps_it() -> None:
    decider = QueryDecider(BOOK, _policy("ctx-ucb:on=pld"))
    assert decider.choose([3], 0, load=8) == Choice(0, (True, 3))
    assert decider.choose([0], 0, imposed=2) == Choice(2, (False,)) and decider.policy.key == (False,)


def test_feedback_credit_and_the_warm_start() -> None:
    shared = _policy("ucb:keep=true,reward=length")
    shared.begin_query()
    decider = QueryDecider(BOOK, copy_learner(shared, np.random.default_rng(1)), keep_rounds=True)
    assert decider.policy is not shared and decider.policy.rng is not shared.rng
    record = _record(0, 5)
    assert decider.learn(Choice(0), record) == 5.0 and record.reward == 5.0
    decider.credit_plain(Choice(0), record, 0.004)
    decider.credit_plain(Choice(2), _record(2, 1), 0.004)  # none was played: nothing to credit
    record.verify_s += 1.0  # charged afterwards (a prompt's prefill): the history kept what was heard
    assert [(arm, r.emitted, r.verify_s) for _, arm, r in decider.history] == [(0, 5, 0.01), (2, 1, 0.004)]
    assert decider.policy.pulls.tolist() == [1.0, 0.0, 1.0]
    warm_start(shared, decider)
    assert shared.pulls.tolist() == [1.0, 0.0, 1.0]
    alone = QueryDecider(BOOK, shared)  # queries one after another: the shared learner itself, no history
    alone.learn(Choice(1), _record(1, 2))
    assert alone.history is None and shared.pulls.tolist() == [1.0, 1.0, 1.0]
    hedge = QueryDecider(BOOK, _policy("hedge"), keep_rounds=True)
    assert hedge.learn(Choice(0), _record(0, 3)) is None and len(hedge.history) == 1  # the evaluation phase's


def test_the_load_limits() -> None:
    costs = StepCostModel()
    costs.coef, costs.draft_cost_known = (8e-3, 5e-4, 1e-3, 0.0), True
    assert load_limits(costs, BOOK, 1, 0.9) == Limits(8)
    assert load_limits(costs, BOOK, 4, 0.9).cap == length_cap(costs.coef, 4, 8, 0.9) == 4
    assert load_limits(costs, BOOK, 32, 0.9) == Limits(0, blocked=BOOK.drafting)
    assert load_limits(costs, BOOK, 32, 0.0) == NO_LIMITS  # the cap off
    costs.model_token_s.extend([2e-3] * 4)  # what a model drafter's token costs to draft, measured
    assert load_limits(costs, BOOK, 2, 0.9) == Limits(6)  # a model draft of 2 still pays
    assert load_limits(costs, BOOK, 2, 0.9, trim_models=True) == Limits(6, 2)
    assert load_limits(costs, BOOK, 3, 0.9) == Limits(5, blocked=frozenset({1}))  # none does
    assert limits_at(BOOK, 5, 0).length(1, BOOK) == 4 and limits_at(BOOK, 5, 2, trim_models=True).length(1, BOOK) == 2
    assert limits_at(BOOK, 5, 2).length(0, BOOK) == 5
    costs.model_verdicts.extend([(0, 4), (1, 4), (0, 4), (1, 4)])  # its drafts measured: 2 of 6 kept
    assert load_limits(costs, BOOK, 2, 0.9) == Limits(6, blocked=frozenset({1}))  # under load, priced at 1/3
    assert load_limits(costs, BOOK, 1, 0.9) == Limits(8)  # alone, at 0.9: it keeps being played and measured


@pytest.mark.parametrize("spec", ["ucbspec:reward=length", "exp3:reward=length"])
def test_one_learner_per_load_learns_the_round_and_what_it_reveals(spec) -> None:
    names = ("len@0", "len@2", "len@4")
    learners = LoadLearners(_policy(spec, names))
    bucket, arm = learners.choose(3)
    assert bucket == 1 and arm in range(3) and learners.choose(1)[0] == 0 and sorted(learners.learners) == [0, 1]

    def record_of(arm: int, cut) -> RoundRecord:
        return RoundRecord(index=0, arm=arm, arm_name=names[arm], max_draft=2 * arm, drafted=cut.drafted,
                           accepted=cut.accepted, emitted=cut.emitted, position=0, verify_s=1.0)

    played = learners.learn(1, 2, [(4, 3, 4), (4, 0, 1), (0, 0, 1)], [(1, 2), (0, 0)], record_of)
    assert (played.arm, played.emitted, played.reward) == (2, 6, 6.0)
    learner = learners.learners[1]
    if learner.side_observations:  # the shorter lengths heard as evidence, not as rounds played
        assert learner.pulls.tolist() == [1.0, 1.0, 1.0] and learner.t == 1
        assert learner.sums.tolist() == [3.0, 5.0, 6.0]
