"""The decision core: which arm each round of a query plays, and what its learner hears.

Three drivers run rounds — the single-query engine (:mod:`draftwise.engine.loop`), the batched
engine (:mod:`draftwise.engine.batch`, a lane per query) and the vLLM proposer
(:mod:`draftwise.vllm.core`, a learner per request) — and all of them decide here:

* per query, a :class:`QueryDecider`: the round's context (which lookups the learner watches
  propose), the learner's choice among the arms the load allows (:class:`Limits`), the round's
  outcome (:meth:`~QueryDecider.learn`) and what ``none`` would have earned
  (:meth:`~QueryDecider.credit_plain`);
* across queries, the warm start: queries that run at once learn on copies of one learner
  (:func:`copy_learner`) whose rounds are replayed into it as each one ends (:func:`warm_start`);
* per round of a batch, the load's limits (:func:`load_limits`: a cap on every draft, the arms no
  query may play) and, where one learner decides for the whole batch, :class:`LoadLearners`.

A driver drafts, verifies and times; it hands the core what it saw (how much each watched lookup
proposes, the round's record in its own time unit, what a plain round costs) and plays the arm the
core chose. Nothing here reads a clock.
"""

from __future__ import annotations

import copy
import statistics
import sys
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from draftwise.decision.arms import Arm, lookups_among, model_arms
from draftwise.decision.step_costs import CutRound, StepCostModel, cut_round, load_bucket, model_draft_cap
from draftwise.drafters import Drafter
from draftwise.policies import Policy, PolicySpec, make_policy, parse_policy
from draftwise.policies.base import policy_options, replay
from draftwise.policies.contextual import watch_lookups
from draftwise.trace import RoundRecord

Key = tuple[Hashable, ...] | None  # a contextual learner's context (None: the learner has none)
Heard = tuple[Key, int, RoundRecord]  # a round as a learner heard it: context, arm, record


@dataclass(frozen=True)
class Choice:
    """The arm a round plays and the context it was chosen in; ``heard`` False: a round the driver
    played without the learner, which does not learn it."""

    arm: int
    key: Key = None
    heard: bool = True


@dataclass(frozen=True)
class ArmBook:
    """What deciding needs to know of the arms, worked out once for a pool and a learner."""

    names: tuple[str, ...]
    lengths: tuple[int, ...]  # each arm's draft length
    none: int | None  # the no-speculation arm
    drafting: frozenset[int]  # the arms that draft
    models: frozenset[int]  # the arms drafting with a model drafter (a routed arm's candidates all are)
    # The pool index of each drafter the learner's context watches (None: not in the pool, never
    # proposes); empty when none of them is in the pool: the learner then has no context at all.
    watched: tuple[int | None, ...]
    # Every drafting arm drafts first with a watched drafter: where none of them proposes, no arm can draft.
    lookups_only: bool

    @property
    def longest(self) -> int:
        return max(self.lengths, default=0)

    @property
    def longest_model(self) -> int:
        return max((self.lengths[a] for a in self.models), default=0)


def arm_book(arms: Sequence[Arm], drafters: Sequence[Drafter], watch: Sequence[str] = ()) -> ArmBook:
    """The facts of ``arms`` over ``drafters``; ``watch``: the names of the drafters the learner's
    context watches (its ``context_on``)."""
    names = [d.name for d in drafters]
    watched = tuple(names.index(n) if n in names else None for n in watch)
    if all(i is None for i in watched):
        watched = ()
    return ArmBook(
        names=tuple(a.name for a in arms), lengths=tuple(a.draft_len for a in arms),
        none=next((i for i, a in enumerate(arms) if a.drafter is None), None),
        drafting=frozenset(i for i, a in enumerate(arms) if a.drafter is not None),
        models=model_arms(arms, drafters), watched=watched,
        lookups_only=all(a.drafter is None or a.drafter in watched for a in arms))


def make_learner(spec: str | PolicySpec, arms: Sequence[Arm], drafters: Sequence[Drafter],
                 rng: np.random.Generator) -> Policy:
    """The learner ``spec`` names, over ``arms`` (``ctx-ucb`` watching the lookups among them:
    :func:`~draftwise.policies.contextual.watch_lookups`)."""
    return make_policy(watch_lookups(parse_policy(spec), lookups_among(arms, drafters)), [a.name for a in arms], rng)


def length_learner(spec: str | PolicySpec, lengths: Sequence[int], rng: np.random.Generator) -> Policy:
    """One learner over draft lengths for a whole batch (BanditSpec §6.2), its arms ``len@N``; a learner
    whose loss is scaled by the longest draft (``max_draft``) is told the longest of ``lengths``."""
    parsed = parse_policy(spec)
    if "max_draft" in policy_options(parsed.name):
        parsed = parsed.with_defaults(max_draft=max(lengths))
    return make_policy(parsed, [f"len@{n}" for n in lengths], rng)


# -- what the load allows ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    """What a batch's load allows one round, the same for every query in it."""

    cap: int = sys.maxsize  # the longest draft of any arm (0: none drafts)
    model_cap: int = sys.maxsize  # the longest draft of a model arm
    # Arms no query may play this round: a learner that knows how skips them; for the others the
    # query plays ``none`` instead, and its learner hears that.
    blocked: frozenset[int] = frozenset()

    def length(self, arm: int, book: ArmBook) -> int:
        """The longest draft ``arm`` may propose this round."""
        cap = min(self.cap, self.model_cap) if arm in book.models else self.cap
        return min(book.lengths[arm], cap)


NO_LIMITS = Limits()  # a query alone: nothing limits its drafts


def model_cap(costs: StepCostModel, book: ArmBook, requests: int, acceptance: float,
              summary: Callable[[Sequence[float]], float] = statistics.fmean) -> int:
    """The longest model draft that pays at this load, counting what a model drafter's token costs
    to draft (``summary`` of its recent plays, measured by the driver) besides its verification: a
    query's model drafting runs while every other query waits (:func:`~draftwise.decision.step_costs.
    model_draft_cap`; the longest model arm's length while too few plays are measured). Under load
    its tokens are priced at ``acceptance`` or at the acceptance its drafts have measured, if lower
    (where the driver records it); a lone query's at ``acceptance``: its own learner judges them, and
    its plays keep the measure current (priced at a low measure, a model arm once blocked would
    never be measured again)."""
    measured = costs.model_acceptance()
    if measured is not None and acceptance > 0 and requests > 1:
        acceptance = min(acceptance, measured)
    return model_draft_cap(costs.coef, requests, book.longest_model, acceptance, costs.model_token_s, summary)


def limits_at(book: ArmBook, cap: int, models_cap: int, trim_models: bool = False) -> Limits:
    """The limits of a round whose drafts are capped at ``cap`` and model drafts pay up to
    ``models_cap`` tokens: where no length pays (``cap`` 0) every drafting arm is blocked, where no
    model draft does the model arms are; ``trim_models`` also cuts model drafts to ``models_cap``
    (the vLLM proposer's: the batched engine cuts every chain to the batch's best padded width instead)."""
    if cap == 0:
        return Limits(0, blocked=book.drafting)
    blocked = book.models if book.models and models_cap == 0 else frozenset()
    return Limits(cap, models_cap if trim_models else sys.maxsize, blocked)


def load_limits(costs: StepCostModel, book: ArmBook, requests: int, acceptance: float, *, longest: int | None = None,
                trim_models: bool = False, summary: Callable[[Sequence[float]], float] = statistics.fmean,
                capped: bool = True) -> Limits:
    """The limits of a round of ``requests`` queries: every draft cut to the length that pays most
    at this load for a drafter accepting each token with probability ``acceptance`` (0, or
    ``capped`` False: no cap; :meth:`~draftwise.decision.step_costs.StepCostModel.cap`, weighing
    lengths up to ``longest``, by default the longest arm's; it probes while a draft token's cost is
    unknown), the model arms blocked where none of their drafts pays (:func:`model_cap`); see
    :func:`limits_at`."""
    if acceptance <= 0 or not capped:
        cap = sys.maxsize
    else:
        cap = costs.cap(requests, book.longest if longest is None else longest, acceptance)
    models = model_cap(costs, book, requests, acceptance, summary) if cap and book.models else sys.maxsize
    return limits_at(book, cap, models, trim_models)


# -- a query's decisions -------------------------------------------------------------------------------
class QueryDecider:
    """One query's learner as its rounds meet it: :meth:`choose` before a round, :meth:`learn` (and
    :meth:`credit_plain`) after it.

    ``hear_idle`` False: a round in which no arm can draft — no watched lookup proposes and every
    drafting arm drafts with one, or the arm chosen is blocked and there is no ``none`` — is played
    plain without the learner (:meth:`choose` returns None): inside vLLM every request pays the
    learner's work each step, and such a round teaches it nothing. ``keep_rounds``: keep every round
    heard, for :func:`warm_start` (a query learning on a copy of a shared learner).
    """

    def __init__(self, book: ArmBook, policy: Policy, *, rng: np.random.Generator | None = None,
                 keep_rounds: bool = False, hear_idle: bool = True) -> None:
        self.book, self.policy, self.hear_idle = book, policy, hear_idle
        self.full_information = policy.needs.full_information
        self.history: list[Heard] | None = [] if keep_rounds else None
        policy.begin_query(rng)

    def choose(self, proposed: Sequence[int], position: int, limits: Limits = NO_LIMITS, imposed: int | None = None,
               load: int | None = None) -> Choice | None:
        """The round's arm. ``proposed``: how many tokens each watched drafter proposes here, in
        ``book.watched`` order (asked only where that is not empty); ``position``: the answer's
        tokens so far; ``imposed``: an arm the driver plays (a calibration round), which the learner
        still learns in this round's context; ``load``: the round's queries, when the context holds
        their :func:`~draftwise.decision.step_costs.load_bucket`."""
        key: Key = None
        if self.book.watched:
            if not self.hear_idle and self.book.lookups_only and not any(proposed):
                return None
            key = self.policy.context_key(tuple(proposed), position)
            if load is not None:
                key = (*key, load_bucket(load))
            self.policy.set_context(key)
        arm = imposed if imposed is not None else self.policy.select_unblocked(limits.blocked)
        if arm in limits.blocked:
            if self.book.none is not None:
                arm = self.book.none
            elif not self.hear_idle:
                return None
        return Choice(arm, key)

    def learn(self, choice: Choice, record: RoundRecord) -> float | None:
        """The played round's outcome. A bandit learner hears it now (the reward comes back and is
        set on the record); a full-information learner hears it from the evaluation phase, which
        first scores every arm on the round (:mod:`draftwise.engine.evaluation`)."""
        if not choice.heard:
            return None
        if self.history is not None:
            # a copy: a driver may charge the record later (round 1's prompt prefill), which the
            # learner never heard and a replay must not either
            self.history.append((choice.key, choice.arm, record.snapshot()))
        if self.full_information:
            return None
        record.reward = self.policy.update(choice.arm, record)
        return record.reward

    def credit_plain(self, choice: Choice, record: RoundRecord, seconds: float) -> None:
        """Tell the learner what the no-speculation arm would have earned in ``record``'s round,
        known without playing it: one token for ``seconds`` (a plain round's cost, in the record's
        unit). Learners then compare every drafting arm with an exact ``none`` from the first rounds
        instead of paying to find it; the counterfactual joins the history like a played round."""
        none = self.book.none
        if none is None or none == choice.arm or self.full_information:
            return
        plain = RoundRecord(index=record.index, arm=none, arm_name=self.book.names[none], max_draft=0, drafted=0,
                            accepted=0, emitted=1, position=record.position, verify_s=seconds)
        self.policy.update(none, plain)
        if self.history is not None:
            self.history.append((choice.key, none, plain))


# -- across queries ------------------------------------------------------------------------------------
def copy_learner(shared: Policy, rng: np.random.Generator) -> Policy:
    """A query's own learner where queries run at once (a batch's lanes, vLLM's requests): a copy of
    the shared one — what the queries before taught it — drawing from its own generator."""
    return shared.clone(rng)


def warm_start(shared: Policy, decider: QueryDecider) -> None:
    """A query that learned on a copy has ended: its rounds are replayed into the shared learner, as
    if the queries had run one after another (when it kept them: a learner with ``keep``)."""
    if decider.history is not None:
        replay(shared, decider.history)


# -- one learner for the whole batch -------------------------------------------------------------------
RecordOf = Callable[[int, CutRound], RoundRecord]  # the driver's record of a round cut to an arm's length


class LoadLearners:
    """One learner picks one arm for the whole batch each round (BanditSpec §6.2: a draft length):
    one learner per load (:func:`~draftwise.decision.step_costs.load_bucket` of the rows in the round), each
    a copy of the shared learner the first time its load is seen. The best length moves with the
    load — drafting is nearly free at one row and costs a row's step per token when the forward is
    compute-bound — and a continuous batch runs at many loads (its tail drains to one row): one
    learner over all of them would average those regimes."""

    def __init__(self, shared: Policy) -> None:
        self.shared = shared
        self.learners: dict[int, Policy] = {}

    def choose(self, rows: int) -> tuple[int, int]:
        """The learner (its load bucket) for a round of ``rows`` rows, and the arm it plays."""
        bucket = load_bucket(rows)
        if bucket not in self.learners:
            self.learners[bucket] = copy.deepcopy(self.shared)
        return bucket, self.learners[bucket].select()

    def learn(self, bucket: int, played: int, outcomes: Sequence[tuple[int, int, int]],
              reveals: Sequence[tuple[int, int]], record_of: RecordOf) -> RoundRecord:
        """The round of ``outcomes`` (each row's drafted, accepted, emitted) for the arm played; and,
        each chain cut shorter (:func:`~draftwise.decision.step_costs.cut_round`: a prefix keeps what it
        had accepted), a side observation for every ``(arm, length)`` it ``reveals`` (evidence, not
        a round played). Returns the played arm's record, its reward set."""
        learner = self.learners[bucket]
        record = record_of(played, cut_round(outcomes, None))
        record.reward = learner.update(played, record)
        for arm, length in reveals:
            learner.side_update(arm, record_of(arm, cut_round(outcomes, length)))
        return record
