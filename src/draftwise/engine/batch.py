"""Batched rounds: many queries share each target forward, each with its own arm and learner.

Every query of a batch is a *lane*: an :class:`~draftwise.engine.loop.Engine` of its own whose
target is the query's row of one :class:`~draftwise.models.batched_lm.BatchedLM`, whose drafters are the
query's copies of the pool (:class:`~draftwise.drafters.pool.DrafterPool`: per-query caches and
indexes, shared weights and stores) and whose learner is a copy of the shared one. A round runs
the lanes' own select → draft, then **one** target forward for every lane's draft, then each
lane's own verify → accept → feedback. Lanes join and leave between rounds (continuous batching);
queries that join together run their prompts through the target together (``join_many``: one
forward per group of similar lengths, where row by row every prompt stalled the batch alone).

Shared cost. The forward's time is shared by its rows: a fitted step-cost model
(:mod:`draftwise.decision.step_costs`, ``T ≈ a + b·R + c·D``) splits it, each row paying ``a/R + b + c·d``
for its ``d`` draft tokens. ``D`` is what the forward computes: every row padded to the longest
draft, R × that width (a fit on the sum of the drafts would make a batch where a few rows draft
look several times cheaper than it is). Throughput rewards therefore see what drafting
really costs at this batch size: nearly nothing at batch 1, about a plain row's step per draft token when the forward
is compute-bound — so speculation backs off as the batch grows.

Each lane's learner is also told, every round it drafted, what no speculation would have earned:
one token for a plain row's share of the forward (``credit_plain``; the vLLM proposer's
``free_none``). It then weighs every drafting arm against an exact ``none`` from the first rounds —
which matters under load, where a query's LM drafting holds up the whole batch. And every lane's
draft is cut to the length that pays most at this batch size for a drafter accepting each token
with probability ``cap_acceptance`` (0.9; the vLLM proposer's load cap,
:func:`~draftwise.decision.core.load_limits`); where no length pays, every drafting arm is blocked for
the round and each lane plays ``none``. On the dev set it gave +3 % / +5 % tokens/s to the
default at B = 16 / 32 (2026-11-25, one run each, within noise) and nothing at B = 1.

Two ways to decide (``decide``):

* ``"query"`` — each lane's learner picks its own arm (MetaSD's instance-level choice in mixed
  batches, and the default policy);
* ``"batch"`` — one learner picks one arm for the whole batch each round, rewarded by the
  round's throughput (BanditSpec §6.2: draft lengths 0..L by UCBSpec); one such learner per load
  bucket (rows in the round), each a copy of the shared one, and every round also teaches the
  shorter lengths it reveals (``shorter_arms``).

With the learner's ``keep`` a finished lane's rounds are replayed into the shared learner
(:func:`~draftwise.decision.core.warm_start`), so later queries start from what earlier ones learned.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from draftwise.decision.arms import Arm
from draftwise.decision.core import NO_LIMITS, Limits, LoadLearners, arm_book, copy_learner, load_limits, warm_start
from draftwise.decision.pricing import OPTIMISM, DraftAcceptance, DraftGate, Key, RoundPrices, admitted, earned_seconds
from draftwise.decision.routing import PromptFit, RouteMemory
from draftwise.decision.step_costs import (
    MODEL_COST_KNOWN,
    CutRound,
    DraftSurvival,
    StepCostModel,
    StepShape,
    best_width,
    measured_shares,
)
from draftwise.drafters.pool import DrafterPool, attach_banks
from draftwise.engine.loop import Engine, Planned, QueryOutcome
from draftwise.engine.query import QuerySettings, QueryState
from draftwise.models.batched_lm import BatchedLM, RowLM
from draftwise.models.cached_lm import prompt_blocks
from draftwise.models.costs import CostCurve
from draftwise.policies import Policy, make_policy
from draftwise.trace import RoundRecord
from draftwise.verify.coupling import CoupledDraw, DrawJob, NoiseScreen, coupled_draws
from draftwise.verify.draft import Draft

log = logging.getLogger(__name__)

DECISIONS = ("query", "batch")
EXPLORE_CUTS = 8  # every 8th width cut is skipped, so the survival it rests on keeps being measured


@dataclass
class BatchTiming:
    """Where a batch's round time went: the target's forwards, the drafters, the learners
    (selection, updates, full-information evaluation), the sampled rows' draws (warp, noise, the
    draw: decoding work plain sampling does too), and the rest (verification, inputs, cost model,
    records: the bookkeeping)."""

    rounds: int = 0
    rounds_s: float = 0.0
    forward_s: float = 0.0
    draft_s: float = 0.0
    policy_s: float = 0.0
    sample_s: float = 0.0
    width_cuts: int = 0  # rounds whose drafts were cut: to a narrower padded width, or slot by slot (per-query)
    capped_rounds: int = 0  # rounds in which the load cap let no lane draft (per-query decisions)
    gated_rounds: int = 0  # rounds in which no lane drafted or chose, drafting not paying at that load

    @property
    def bookkeeping_s(self) -> float:
        return max(0.0, self.rounds_s - self.forward_s - self.draft_s - self.policy_s - self.sample_s)


@dataclass
class Lane:
    """One query of the batch: its engine (row, drafter copies, learner copy) and its state."""

    engine: Engine
    query: QueryState
    row: RowLM
    joined: float  # perf_counter when it joined
    prefill_s: float  # target time on its prompt before round 1 (charged to round 1)
    setup_s: float  # drafters' time on its prompt (routing, prompt prior; charged to round 1)
    outcome: QueryOutcome | None = None  # set when it leaves


class BatchEngine:
    """Runs many queries at once with one target, a pool of drafters, a list of arms and a learner."""

    def __init__(self, model: Any, drafters: Sequence[Any], arms: Sequence[Arm], policy: Policy, *,
                 decide: str = "query", fast_drafters: bool = True, head_dtype: str | None = None,
                 prompt_fit: PromptFit = PromptFit(), credit_plain: bool = True,
                 cap_acceptance: float = 0.9, cut_width: bool = True, costs: StepCostModel | None = None,
                 routes: RouteMemory | None = None, curve: CostCurve | None = None,
                 acceptance: DraftAcceptance | None = None, gate: DraftGate | None = None) -> None:
        if decide not in DECISIONS:
            raise ValueError(f"decide must be one of {', '.join(DECISIONS)}, got {decide!r}")
        self.target = BatchedLM(model)
        self.pool = DrafterPool(drafters)
        self.arms = list(arms)
        self.policy = policy  # the shared learner: lanes learn on copies (decide="query") or copies decide
        self.decide = decide
        # Per-query learners hear every round what no speculation would have earned (a plain row's
        # share of the forward, from the cost model): under load their LM arms cost the whole batch
        # time, and a learner that had to play ``none`` to learn that learned it too late.
        self.credit_plain = credit_plain
        self.cap_acceptance = cap_acceptance
        # Per-query decisions: cut every chain to the width that pays for the whole padded batch
        # (``_cut_to_width``), from each draft position's measured survival.
        self.cut_width = cut_width
        # Where the forward multiplies tokens, not padded rows (an exact target's), per-query lanes'
        # draft tokens are admitted slot by slot instead (``_admit``): by each token's predicted
        # acceptance (``acceptance``, shared with the single-query engine's priced drafts) against
        # what one more token costs the batch's forward (the machine's ``curve`` of batch steps,
        # corrected by the forwards measured here).
        self.acceptance = acceptance if policy.needs.priced else None
        self.prices = RoundPrices(curve.step_s, longest=256) if curve is not None else None
        # Switches of measured mechanisms, each on; off only to measure what it is worth
        # (benchmarks/batch_ab.py, BENCHMARKS.md "Batched engine"):
        self.share_prefill = True  # queries joining together share their prompts' forwards (off: row by row)
        self.scout_models = True  # one lane a round tries a model arm while its cost is unknown (off: any lane)
        self.reserve_at_join = True  # joins make room for their queries' longest contexts (off: grow when full)
        self.cuts_due = 0
        self.survival = DraftSurvival(max((arm.draft_len for arm in arms), default=1) or 1, prior=cap_acceptance or 0.9)
        self.noise_screen: NoiseScreen | None = NoiseScreen()  # coupled sampling: shared by every lane's engine
        # Arms drafting with a model (routed arms: every candidate is one), and what one of their
        # draft tokens costs a lane: the mean of recent plays, first plays included (a lane's first
        # play routes and prefills its drafter — ≈ 20 ms on this CPU, 15–50 ms on an H200 against a
        # 4 ms step — while every row waits, and each new lane pays it again; a median leaves that
        # out). Every play counts, a draft cut to 0 by the padded width too: counting only drafted
        # ones kept the cost unknown on an H200, and lanes went on trying model arms at 32 rows
        # (0.84× plain decoding; 1.17× once measured). Under load they are blocked for every lane
        # (``_limits``).
        self.book = arm_book(self.arms, self.pool.templates, policy.needs.context_on)
        # … and where, at a load, what the admitted tokens earn does not pay for the lanes' drafting
        # and choosing, the lanes decode plainly (every lane's lookups and learner cost ≈ 0.1 ms a
        # round here: 2–3 % of a round of 8 rows, which on answers unlike their prompts earn less)
        gated = self.acceptance is not None and self.target.packs and self.book.none is not None \
            and not policy.needs.full_information
        self.gate = (gate if gate is not None else DraftGate()) if gated else None  # a Generator's sessions share it
        self.mean_model_cost = True  # off: the median of recent plays, which leaves first plays out (A/B switch)
        self.longest_draft = self.book.longest
        self.fast_drafters = fast_drafters
        self.head_dtype = head_dtype
        self.prompt_fit = prompt_fit
        self.routes = routes if routes is not None else RouteMemory()  # what routing learns, shared by the lanes
        self.costs = costs if costs is not None else StepCostModel()  # a Generator's sessions share theirs
        self.model_token_s = self.costs.model_token_s  # shared with the costs (see StepCostModel)
        self.lanes: list[Lane] = []
        self.timing = BatchTiming()
        self.batch_records: list[RoundRecord] = []  # decide="batch": the batch learner's rounds
        self.shorter = shorter_arms(self.arms)  # decide="batch": the side observations of each arm
        self.load_learners = LoadLearners(policy)  # decide="batch": one learner per load bucket

    # -- lanes ----------------------------------------------------------------------------------------
    def join(self, prompt: Sequence[int], settings: QuerySettings, generator: torch.Generator | None,
             seed: int) -> Lane:
        """Add a query: its row, drafter copies and learner; its prompt runs through the target now
        (on its own row), so the batched rounds feed each row only its last token and its draft."""
        return self.join_many([(prompt, settings, generator, seed)])[0]

    def join_many(self, queries: Sequence[tuple[Sequence[int], QuerySettings, torch.Generator | None, int]]
                  ) -> list[Lane]:
        """Add several queries (``join``'s arguments each) at once: their prompts share target
        forwards — one per group of similar lengths (:func:`prefill_groups`) — where row by row
        each prompt would be a forward of its own while the batch waits. Returns their lanes in the
        order given; if one fails, none joins."""
        order = sorted(range(len(queries)), key=lambda i: len(queries[i][0]))  # similar lengths on adjacent rows
        # room for every joining query's longest possible context (prompt, answer, a draft on top)
        if self.reserve_at_join:
            longest = max((len(prompt) + settings.max_new_tokens for prompt, settings, _, _ in queries), default=0)
            self.target.reserve(len(self.target.rows) + len(queries), longest + self.longest_draft + 1)
        lanes: dict[int, Lane] = {}
        try:
            for i in order:
                lanes[i] = self._add_lane(*queries[i])
            self._prefill([lanes[i] for i in order])
        except BaseException:
            for lane in lanes.values():
                self.target.drop_row(lane.row)
                self.lanes.remove(lane)
            raise
        return [lanes[i] for i in range(len(queries))]

    def _add_lane(self, prompt: Sequence[int], settings: QuerySettings, generator: torch.Generator | None,
                  seed: int) -> Lane:
        row = self.target.add_row()
        try:
            drafters = self.pool.copies()
            if self.fast_drafters:
                attach_banks(drafters, self.head_dtype)
            engine = Engine(row, drafters, self.arms, self._lane_policy(seed), self.prompt_fit, self.routes,
                            keep_rounds=self.decide == "query" and self.policy.needs.keep)
            engine.noise_screen = self.noise_screen  # one screen learns from every lane
            engine.pricing = self.acceptance  # its rounds teach the shared estimate (the batch prices them)
            query, prefill_s, setup_s = engine.start(prompt, settings, generator)
        except BaseException:
            self.target.drop_row(row)
            raise
        lane = Lane(engine, query, row, time.perf_counter(), prefill_s, setup_s)
        self.lanes.append(lane)
        return lane

    def _prefill(self, lanes: Sequence[Lane]) -> None:
        """Run the prompts of ``lanes`` (just added, on adjacent rows, shortest first) that their
        engines have not prefilled — all but the last token, which round 1 feeds — in shared
        forwards; each lane is charged its share of a forward's time by its prompt's length."""
        todo = [lane for lane in lanes if lane.row.length == 0 and lane.query.prompt_len > 1]
        runs: list[list[Lane]] = []
        for lane in todo:  # rows adjacent in the buffers: a forward reads one contiguous slice
            if runs and runs[-1][-1].row.index + 1 == lane.row.index:
                runs[-1].append(lane)
            else:
                runs.append([lane])
        for run in runs:
            prompts = [lane.query.context[: lane.query.prompt_len - 1] for lane in run]
            groups = prefill_groups([len(p) for p in prompts]) if self.share_prefill else \
                [range(i, i + 1) for i in range(len(run))]
            for group in groups:
                start = time.perf_counter()
                # a long prompt in blocks (its rows exact in any split): memory bounded by a block
                blocks = prompt_blocks(len(prompts[group[-1]])) if self.target.exact else []
                for stop in [*blocks, None]:
                    self.target.run([run[i].row.chain_input(prompts[i][:stop], 1) for i in group
                                     if stop is None or len(prompts[i]) > stop])
                seconds = time.perf_counter() - start
                total = sum(len(prompts[i]) for i in group)
                for i in group:
                    run[i].prefill_s += seconds * len(prompts[i]) / total

    def _lane_policy(self, seed: int) -> Policy:
        if self.decide == "batch":  # the batch learner decides; a lane only follows
            return make_policy("fixed:arm=0", [a.name for a in self.arms], np.random.default_rng(seed))
        return copy_learner(self.policy, np.random.default_rng(seed))

    def leave(self, lane: Lane, stopped_by: str | None = None) -> QueryOutcome:
        """Remove a query (finished, or cancelled between rounds): deliver its pending feedback, add
        its response to the shared stores, replay its rounds into the shared learner (``keep``),
        free its row. Returns its outcome."""
        query = lane.query
        if stopped_by is not None and query.stopped_by is None:
            query.stopped_by = stopped_by
        lane.engine.finish(query, end_drafters=False)
        self.pool.finish(query.context, query.prompt_len, lane.engine.drafters)
        warm_start(self.policy, query.decider)
        self.target.drop_row(lane.row)
        self.lanes.remove(lane)
        extra = 1 if query.prompt_len > 1 else 0  # the prompt's own forward
        lane.outcome = QueryOutcome(query.context, query.records, query.stopped_by or "max_new_tokens",
                                    time.perf_counter() - lane.joined, extra)
        return lane.outcome

    def recover(self) -> None:
        """After an interrupt: forget every row's cache and every drafter's per-query state (the
        queries' tokens stay; the next round re-syncs from them)."""
        self.target.reset()
        for lane in self.lanes:
            lane.engine.recover()

    # -- a round --------------------------------------------------------------------------------------
    def round(self) -> list[Lane]:
        """One round of every lane: their drafts verified in one target forward. Returns the lanes
        that finished in it (still in the batch: call :meth:`leave`)."""
        lanes = [lane for lane in self.lanes if not lane.query.finished]
        if not lanes:
            return []
        try:
            return self._round(lanes)
        except BaseException:
            self.recover()
            raise

    def _round(self, lanes: list[Lane]) -> list[Lane]:
        clock = time.perf_counter
        start = clock()
        bucket, forced = self.load_learners.choose(len(lanes)) if self.decide == "batch" else (0, None)
        limits = self._limits(len(lanes)) if forced is None else NO_LIMITS
        self.timing.capped_rounds += limits.cap == 0 and bool(self.book.drafting)
        # While a model drafter's cost is unknown, one lane a round may try it: lanes that start
        # together are copies of one learner and would all pick it in the same round, each
        # drafting (routing, a prefill: ≈ 25 ms on CPU) while every row waits.
        scout = self.scout_models and forced is None and len(lanes) > 1 and len(self.model_token_s) < MODEL_COST_KNOWN
        plans = []
        models = self.book.models
        gated = forced is None and self.gate is not None and len(lanes) > 1 and not self.gate.opens(len(lanes))
        if gated:
            self.timing.gated_rounds += 1
            plans = [lane.engine.plain_plan(lane.query) for lane in lanes]
        else:
            for lane in lanes:
                self.pool.refresh(lane.engine.drafters)
                plan = lane.engine.plan(lane.query, forced, limits=limits)
                if scout and plan.arm in models:
                    limits = replace(limits, blocked=limits.blocked | models)
                plans.append(plan)
        chains = all(plan.draft.parents is None for plan in plans)
        drafted = [len(plan.draft.tokens) for plan in plans]  # before any cut: what the drafters spent on
        admit = forced is None and chains and self.target.packs and self.prices is not None \
            and self.acceptance is not None
        # per-query lanes: the padded width is theirs (once a draft token's cost is measured)
        measure = forced is None and self.cut_width and chains and self.costs.draft_cost_known and not admit
        if admit and not gated:
            plans = self._admit(lanes, plans)
        elif measure:
            plans = self._cut_to_width(plans)
        inputs = [lane.engine.target_input(lane.query, plan.draft) for lane, plan in zip(lanes, plans)]
        forward_start, grown_s = clock(), self.target.reserve_s
        greedy = [lane.query.settings.sampling.greedy for lane in lanes]
        logits = self.target.run(inputs, argmax=any(greedy))
        seconds = clock() - forward_start
        # Growing the KV buffers (a copy of every row, ≈ 0.1 s at 32 rows × 512 slots) is not what
        # this shape costs: in the fit it tripled the draft-token cost and the load cap then stopped
        # every draft for dozens of rounds — rounds without drafts never correct that coefficient.
        grown_s = self.target.reserve_s - grown_s
        # the forward computes every row's draft (packed), or pads every row to the longest one: its
        # cost grows with the draft tokens, or with rows × that width
        fed = [len(plan.draft.tokens) for plan in plans]
        shape = StepShape(len(lanes), sum(fed) if self.target.packs else len(lanes) * max(fed),
                          max(seconds - grown_s, 1e-6))
        if admit and self.prices is not None:
            self.prices.observe(len(lanes) + sum(fed) - 1, shape.seconds)
        self.costs.observe(shape)
        records = []
        shares = measured_shares(self.costs.coef, shape, fed)
        plain_share = measured_shares(self.costs.coef, shape, [0])[0] if forced is None else 0.0
        draws: list[CoupledDraw | None] = [None] * len(lanes)
        if not all(greedy):
            sample_start = clock()
            draws = batch_draws(lanes, plans, logits)
            self.timing.sample_s += clock() - sample_start
        for lane, plan, rows, share, draw, spent in zip(lanes, plans, logits, shares, draws, drafted):
            record = lane.engine.conclude(lane.query, plan, rows, share, lane.row.choices, draw)
            if record.index == 0:
                record.verify_s += lane.prefill_s
                record.draft_s += lane.setup_s
            elif forced is None and self.credit_plain:
                lane.engine.credit_plain(lane.query, plan, record, plain_share)
            if plan.arm in models:  # a draft cut to 0 still paid for its drafting
                self.model_token_s.append(plan.draft_s / max(spent, 1))
            records.append(record)
        if measure or admit:
            self.survival.observe([(r.drafted, r.accepted) for r in records])
        draft_s = sum(plan.draft_s for plan in plans)
        choose_s = sum(r.policy_s + r.eval_s for r in records)
        prices = self.prices
        if admit and not gated and self.gate is not None and prices is not None and len(lanes) > 1:
            self.gate.observe(len(lanes), earned_seconds(lambda n: prices.seconds(n - 1), len(lanes), sum(fed),
                                                         sum(r.accepted for r in records)), draft_s + choose_s)
        timing = self.timing
        if forced is not None:
            learned = clock()
            self._learn_batch(bucket, forced, chains, records, learned - start - seconds)
            timing.policy_s += clock() - learned
        timing.rounds += 1
        timing.rounds_s += clock() - start
        timing.forward_s += seconds
        timing.draft_s += draft_s
        timing.policy_s += choose_s
        return [lane for lane in lanes if lane.query.finished]

    def _admit(self, lanes: Sequence[Lane], plans: list[Planned]) -> list[Planned]:
        """Per-query decisions on a target whose forward multiplies tokens (chains only): each lane's
        draft cut to the tokens the batch admits (:func:`~draftwise.decision.pricing.admitted`) —
        slots in order of predicted acceptance while one more pays for the row it adds. A lookup's
        tokens are predicted as its single-query rounds are (and teach the same estimate); a model
        drafter's by the batch's measured survival per draft position."""
        assert self.acceptance is not None and self.prices is not None
        survivals: list[list[float]] = []
        keys: list[Key | None] = []
        conditional = [kept / tried for kept, tried in zip(self.survival.kept, self.survival.tried)][1:]
        # Under load an untried slot costs a row every other query waits for: judge by the mean (a
        # query alone explores as it would alone)
        optimism = OPTIMISM if len(lanes) == 1 else 0.0
        for lane, plan in zip(lanes, plans):
            n = len(plan.draft.tokens)
            key = lane.engine.lookup_key(lane.query, plan.arm, plan.draft)
            if key is not None:
                survivals.append(self.acceptance.survival(key, n, optimism))
            else:
                survivals.append([conditional[min(k, len(conditional) - 1)] for k in range(n)])
            keys.append(key)
        prices = self.prices
        keep = admitted(survivals, lambda tokens: prices.seconds(tokens - 1))
        self.timing.width_cuts += any(k < len(plan.draft.tokens) for k, plan in zip(keep, plans))
        return [replace(plan if k == len(plan.draft.tokens) else cut_plan(plan, k), priced=key)
                for plan, k, key in zip(plans, keep, keys)]

    def _cut_to_width(self, plans: list[Planned]) -> list[Planned]:
        """Per-query decisions (chains only): the forward pads every row to the longest draft, so cut every chain
        to the width with the best predicted throughput for the batch (:func:`~draftwise.decision.step_costs.
        best_width`, each row's gain from the measured survival per draft position). A lane's learner
        chose its own draft; this only keeps one row's long draft from costing every row its width."""
        lengths = [len(plan.draft.tokens) for plan in plans]
        longest = max(lengths)
        if longest == 0:
            return plans
        width = best_width(self.costs.coef, lengths, self.survival.expected_accepted(longest))
        if width >= longest:
            return plans
        self.cuts_due += 1
        if self.cuts_due % EXPLORE_CUTS == 0:
            return plans  # a cut draft is never verified: let some through, or a bad start is never undone
        self.timing.width_cuts += 1
        return [plan if n <= width else cut_plan(plan, width) for plan, n in zip(plans, lengths)]

    @property
    def model_summary(self) -> Callable[[Sequence[float]], float]:
        """How a model drafter's recent plays make its cost per token (``mean_model_cost``)."""
        return statistics.fmean if self.mean_model_cost else statistics.median

    def _limits(self, requests: int) -> Limits:
        """Per-query decisions: what this load allows every lane (:func:`~draftwise.decision.core.
        load_limits`): drafts cut to the length that pays most for a drafter accepting each token
        with ``cap_acceptance`` (0 turns the cap off), and where none pays every drafting arm
        blocked; the model-drafter arms blocked when no draft length of theirs pays even for such a
        drafter — a lane's model drafting costs its tokens' verification *and* their forwards, run
        lane by lane while every row waits.

        A query alone is not capped: no other row waits on its draft (and with one row the cap never
        learned a draft token's cost, probing with every other round's draft); only its model arms stay
        blocked where their measured drafting cost rules out every draft of theirs."""
        return load_limits(self.costs, self.book, requests, self.cap_acceptance, summary=self.model_summary,
                           capped=requests > 1)

    def _learn_batch(self, bucket: int, arm: int, chains: bool, records: list[RoundRecord],
                     overhead_s: float) -> None:
        """``decide="batch"``: the batch learner's reward is the round's throughput per row in plain
        steps — tokens per row ÷ (the round's time ÷ a plain round's), the time being the cost
        model's forward for this shape plus the round's measured drafting and bookkeeping. On that
        scale a plain round earns 1 at any batch size (what BanditSpec's radius, in accepted-length
        units, assumes), and the clock's noise on one forward does not decide a length.

        A chain draft of length k also tells what every shorter length of the same drafter would
        have done (the same tokens, cut: min(accepted, j) of j accepted, a shorter forward): each
        arm in ``shorter[arm]`` gets that round as a side observation
        (:meth:`~draftwise.decision.core.LoadLearners.learn`)."""
        a, b, c = (float(v) for v in self.costs.coef[:3])
        rows = len(records)
        plain_row = (a + b * rows) / rows
        index = len(self.batch_records)

        def record_of(played: int, cut: CutRound) -> RoundRecord:
            return RoundRecord(index=index, arm=played, arm_name=self.arms[played].name,
                               max_draft=self.arms[played].draft_len, drafted=cut.drafted, accepted=cut.accepted,
                               emitted=cut.emitted, position=0,
                               verify_s=(a + b * rows + c * rows * cut.width + overhead_s) / plain_row)

        outcomes = [(r.drafted, r.accepted, r.emitted) for r in records]
        reveals = self.shorter[arm] if chains else []
        self.batch_records.append(self.load_learners.learn(bucket, arm, outcomes, reveals, record_of))


PREFILL_SLACK = 1.25  # a shared prompt forward may compute up to 25 % padding
PREFILL_TOKENS = 8192  # and at most this many token slots (its activations)


def batch_draws(lanes: Sequence[Lane], plans: Sequence[Planned], logits: Sequence[torch.Tensor]
                ) -> list[CoupledDraw | None]:
    """The coupled draws of every lane that samples with noise a chain without drafter
    probabilities (plain rows, lookups), made at once; None for the others (greedy lanes, trees,
    model drafts, rejection sampling: each judges its own)."""
    draws: list[CoupledDraw | None] = [None] * len(lanes)
    jobs, at = [], []
    for i, (lane, plan, rows) in enumerate(zip(lanes, plans, logits)):
        query, draft = lane.query, plan.draft
        noise = query.dctx.noise
        if noise is not None and not query.settings.sampling.greedy and draft.parents is None and draft.probs is None:
            jobs.append(DrawJob(noise, len(query.context), draft.tokens, rows, query.settings.sampling))
            at.append(i)
    for i, draw in zip(at, coupled_draws(jobs) if jobs else []):
        draws[i] = draw
    return draws


def prefill_groups(lengths: Sequence[int], slack: float = PREFILL_SLACK,
                   max_tokens: int = PREFILL_TOKENS) -> list[range]:
    """Split prompts sorted by length into consecutive groups that share one forward each: a group
    is padded to its longest, so it grows while its padded size stays within ``slack`` × its real
    tokens and ``max_tokens``.

    >>> prefill_groups([10, 11, 12, 40, 41])
    [range(0, 3), range(3, 5)]
    >>> prefill_groups([100, 100, 100], max_tokens=250)
    [range(0, 2), range(2, 3)]
    """
    groups: list[range] = []
    start, real = 0, 0
    for i, n in enumerate(lengths):
        rows = i - start + 1
        if i > start and (rows * n > slack * (real + n) or rows * n > max_tokens):
            groups.append(range(start, i))
            start, real = i, 0
        real += n
    if lengths:
        groups.append(range(start, len(lengths)))
    return groups


def cut_plan(plan: Planned, width: int) -> Planned:
    """``plan`` with its chain draft cut to its first ``width`` tokens (a prefix: still exact)."""
    draft = plan.draft
    probs = None if draft.probs is None else draft.probs[:width]
    noises = None if plan.noises is None else plan.noises[:width]
    return replace(plan, draft=Draft(draft.tokens[:width], probs), noises=noises)


def shorter_arms(arms: Sequence[Arm]) -> list[list[tuple[int, int]]]:
    """For each arm, the ``(arm, length)`` of every arm that drafts the same chain shorter — the same
    drafter with a smaller budget, and ``none`` (length 0) — whose outcome a round of it reveals.
    Arms with a stopping rule, a route or a union draft reveal nothing of others.

    >>> names = [Arm("none", None, 0), Arm("pld@1", 0, 1), Arm("pld@3", 0, 3), Arm("suffix@2", 1, 2)]
    >>> shorter_arms(names)
    [[], [(0, 0)], [(0, 0), (1, 1)], [(0, 0)]]
    """
    def plain_chain(arm: Arm) -> bool:
        return arm.stop is None and not arm.route and not arm.also

    out: list[list[tuple[int, int]]] = []
    for arm in arms:
        below = []
        if arm.drafter is not None and plain_chain(arm):
            for j, other in enumerate(arms):
                if other.drafter is None or (other.drafter == arm.drafter and plain_chain(other)
                                             and other.draft_len < arm.draft_len):
                    below.append((j, 0 if other.drafter is None else other.draft_len))
        out.append(below)
    return out
