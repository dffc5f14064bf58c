"""The proposer's logic, free of vLLM: per-request learners fed by each step's outcome.

Every step vLLM reports, per row, the tokens it emitted (the accepted part of the draft proposed
last step, plus one target token). :meth:`ProposerCore.step`

1. names the rows (vLLM's request ids, or token matching), retires finished requests (their
   statistics go out, their learner's rounds warm-start the next requests, their response joins
   the suffix store) and starts new ones;
2. times the step, fits the step-cost model, and turns each request's outcome into a
   :class:`~draftwise.trace.RoundRecord` for the draft it proposed the step before;
3. lets each request's learner pick an arm (mode ``request``) — or one UCBSpec learner pick one
   draft length for the whole batch (mode ``batch``, BanditSpec §6.2) — and drafts.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from draftwise.decision import (
    Arm,
    Choice,
    CutRound,
    Limits,
    LoadLearners,
    QueryDecider,
    StepCostModel,
    StepShape,
    arm_book,
    attribute,
    batch_times,
    copy_learner,
    length_learner,
    load_limits,
    make_learner,
    routed_drafter,
    warm_start,
)
from draftwise.decision.pricing import OPTIMISM, DraftAcceptance, DraftGate, admitted, draft_key
from draftwise.decision.step_costs import PlainRate
from draftwise.drafters import Draft, DraftContext
from draftwise.drafters.pool import DrafterPool
from draftwise.errors import DraftwiseError
from draftwise.policies import parse_policy
from draftwise.trace import RoundRecord
from draftwise.vllm.batch_view import BatchView
from draftwise.vllm.options import ProposerOptions, drafter_specs
from draftwise.vllm.pool import build_templates, default_arms, make_arms, stop_rules
from draftwise.vllm.requests import Pending, RequestState, accepted_of, match_rows

log = logging.getLogger("draftwise.vllm")

STALE_STEPS = 100_000  # a request unseen this long (and never reported finished) is dropped


@dataclass(frozen=True)
class EngineFacts:
    """What the proposer needs from vLLM's configuration."""

    num_speculative_tokens: int
    max_model_len: int
    vocab_size: int
    eos_ids: frozenset[int] = frozenset()


PLAIN_STEP = 1.0  # what a step without speculation costs in plain-step time
GATE_EXPLORE = 16  # a load where drafting does not pay still drafts one step in 16, to keep measuring


class ProposerCore:
    """Per-request (or batch-level) learning over a drafter pool; see the module docstring."""

    def __init__(self, options: ProposerOptions, facts: EngineFacts, clock: Any = time.perf_counter) -> None:
        options.validate()
        self.options, self.facts, self.clock = options, facts, clock
        self.draft_len = min(options.draft_len or facts.num_speculative_tokens, facts.num_speculative_tokens)
        if self.draft_len < 1:
            raise DraftwiseError("num_speculative_tokens must be ≥ 1 for the draftwise proposer")
        self.pool = DrafterPool(build_templates(drafter_specs(options, facts.vocab_size), facts.vocab_size))
        drafters = self.pool.templates
        self.ctx = DraftContext(eos_ids=facts.eos_ids)
        self.states: dict[str, RequestState] = {}
        self.costs = StepCostModel()
        self.last_time: float | None = None  # when the previous step's propose began
        self.step_no = 0
        self.started = 0
        self.finished: list[dict[str, Any]] = []  # statistics of finished requests (also logged / written)
        if options.mode == "batch":
            self._init_batch()
            return
        policy = parse_policy(options.policy)  # the spec, parsed once
        layout = options.arms or default_arms(policy, drafters, self.draft_len)
        self.arms: list[Arm] = make_arms(layout, drafters, self.draft_len)
        self.learner = make_learner(policy, self.arms, drafters, np.random.default_rng(options.seed))
        needs = self.learner.needs
        if needs.full_information:
            raise DraftwiseError(f"policy {options.policy!r} needs full-information feedback (an evaluation "
                                 "phase), which the vLLM proposer does not run; use a bandit policy")
        # the no-speculation arm, the model arms (a request's LM draft runs while every other
        # request waits) and the lookups a contextual learner watches (draftwise.decision.core)
        self.book = arm_book(self.arms, drafters, needs.context_on)
        # each lookup draft's tokens' acceptance, predicted before the step and learned from every
        # verified draft, kept across requests: what the step admits of each draft (``admit``)
        self.acceptance = DraftAcceptance() if options.admit else None
        # whether a loaded step drafts at all (``gate``): a drafting step's tokens against what
        # plain steps at that load, measured, emit in the same time — the proposer's lookups and
        # learners included, and whatever a drafted step costs vLLM beyond its tokens (on a 2-core
        # CPU at 32 requests, never-rejected drafts cut to what the target accepts still ran 0.94×
        # no speculation), which no fit of the step's cost over its rows and draft tokens told apart
        self.gate = DraftGate(explore=GATE_EXPLORE) if options.gate else None
        self.plain = PlainRate()
        self.last_load = 0  # decoding requests when the step just verified was proposed

    # -- set-up ------------------------------------------------------------------------------
    def _init_batch(self) -> None:
        lengths = self.options.batch_lengths or tuple(range(self.draft_len + 1))
        if max(lengths) > self.draft_len:
            raise DraftwiseError(f"batch_lengths {list(lengths)} exceed num_speculative_tokens={self.draft_len}")
        self.lengths = tuple(sorted(set(lengths)))
        # the request mode's learner has no batch form: the batch mode's default is UCBSpec's lengths
        named = self.options.policy
        policy = named if parse_policy(named).name != "ctx-ucb" else "banditspec-length"
        self.batch_learner = length_learner(policy, self.lengths, np.random.default_rng(self.options.seed))
        self.load_learners = LoadLearners(self.batch_learner)  # one learner per load bucket
        self.batch_pending: Pending | None = None
        self.arms = []

    # -- the step ------------------------------------------------------------------------------
    def step(self, view: BatchView | None, sampled: Sequence[Sequence[int]], num_tokens: Any,
             token_ids: Any) -> list[list[int]]:
        now = self.clock()
        elapsed = None if self.last_time is None else now - self.last_time  # since the last step began
        self.last_time = now
        self.step_no += 1
        rows = len(sampled)
        ids = view.req_ids if view is not None else match_rows(self.states, sampled, num_tokens, token_ids)
        self._retire(view, ids)
        shape = self._shape(view, ids, sampled, elapsed)
        live = shape is not None and self.costs.observe(shape)
        if self.step_no % 100 == 0:
            log.debug("step %d: step cost a=%.2e b=%.2e c=%.2e p=%.2e s", self.step_no, *self.costs.coef)
        drafts: list[list[int]] = [[] for _ in range(rows)]
        decode: list[tuple[int, RequestState]] = []
        verified: list[tuple[int, RequestState, int]] = []  # rows whose last draft was just verified
        for row in range(rows):
            state, new = self._follow(view, ids[row], row, sampled[row], num_tokens, token_ids)
            if state is None:
                continue
            decode.append((row, state))
            if not new:
                drafted = self._drafted(view, state)
                state.count(len(sampled[row]), drafted)
                verified.append((row, state, drafted))
        if self.options.mode == "batch":
            self._batch_feedback(view, verified, sampled, shape if live else None)
            self._batch_draft(decode, drafts)
        else:
            for row, state, drafted in verified:
                self._feedback(state, len(sampled[row]), drafted, shape if live else None)
            if live and shape is not None and elapsed is not None:
                self._measure(verified, sampled, elapsed - self.costs.coef[3] * shape.prompt_tokens)
            limits = self._limits(len(decode))
            load = len(decode) if self.options.load_context else None
            drafting = limits.cap > 0 and self._drafts(len(decode))
            for row, state in decode:
                drafts[row] = self._draft(state, limits, load) if drafting else []
            if drafting and self.acceptance is not None and self.costs.draft_cost_known:
                self._admit(decode, drafts)
            self.last_load = len(decode)
        return drafts

    def _drafts(self, requests: int) -> bool:
        """Whether this step's requests draft: a lone request always does; under load a step is kept
        plain while the plain steps' rate is due to be measured, and where drafting has not paid."""
        if self.gate is None or requests <= 1:
            return True
        return not self.plain.due(requests) and self.gate.opens(requests)

    def _measure(self, verified: list[tuple[int, RequestState, int]], sampled: Sequence[Sequence[int]],
                 seconds: float) -> None:
        """The step just verified, for the gate (``seconds``: since the previous step began, the
        proposer's work included, its prompt tokens' fitted cost left out): a plain step measures the
        plain rate at its load; a drafting one earned its tokens' time at that rate."""
        requests = self.last_load
        if self.gate is None or requests <= 1 or seconds <= 0 or not verified:
            return
        tokens = sum(len(sampled[row]) for row, _, _ in verified)
        if not any(drafted for _, _, drafted in verified):
            self.plain.observe(requests, tokens, seconds)
            return
        rate = self.plain.rate(requests)
        if rate is not None:
            self.gate.observe(requests, earned_s=tokens / rate, spent_s=seconds)

    def _shape(self, view: BatchView | None, ids: Sequence[str], sampled: Sequence[Sequence[int]],
               elapsed: float | None) -> StepShape | None:
        """The step just verified: requests, extra tokens, and the seconds from the last step's start
        to this one's, net of the per-request drafting in between (each request is charged its own);
        what remains is vLLM's step plus this proposer's shared bookkeeping."""
        if elapsed is None:
            return None
        drafting = sum(s.pending.draft_s for s in self.states.values() if s.pending is not None)
        if self.options.mode == "batch" and self.batch_pending is not None:
            drafting += self.batch_pending.draft_s
        if view is not None:
            return StepShape(view.requests, view.draft_tokens, max(elapsed - drafting, 1e-6), view.prompt_tokens)
        pendings = [self.states[i].pending for i in ids if i in self.states]
        extra = sum(p.drafted for p in pendings if p is not None)
        return StepShape(len(ids), extra, max(elapsed - drafting, 1e-6))

    # -- requests come and go ------------------------------------------------------------------
    def _retire(self, view: BatchView | None, ids: Sequence[str]) -> None:
        present = set(ids)
        if view is not None:
            gone = [rid for rid, s in self.states.items() if rid not in present and (
                rid in view.finished or (view.known is not None and rid not in view.known)
                or self.step_no - s.last_seen > STALE_STEPS)]
        else:
            gone = [rid for rid in self.states if rid not in present]
        for rid in dict.fromkeys(gone):
            self._finish(self.states.pop(rid))

    def _follow(self, view: BatchView | None, rid: str, row: int, emitted: Sequence[int], num_tokens: Any,
                token_ids: Any) -> tuple[RequestState | None, bool]:
        """The row's request, its tokens brought up to date, and whether it is new this step;
        (None, False) while it is still prefilling."""
        if not emitted:
            return None, False  # a partial prefill: vLLM drafts nothing for it either
        n = int(num_tokens[row])
        state = self.states.get(rid)
        if state is None:
            prompt_len = view.prompt_lens[row] if view is not None else n - len(emitted)
            return self._start(rid, [int(t) for t in token_ids[row, :n]], prompt_len), True
        state.last_seen = self.step_no
        if len(state.tokens) + len(emitted) == n:
            state.tokens.extend(int(t) for t in emitted)
        else:  # resumed after preemption, or a row we misread: resynchronise, no feedback this step
            state.tokens = [int(t) for t in token_ids[row, :n]]
            state.pending = None
        return state, False

    @staticmethod
    def _drafted(view: BatchView | None, state: RequestState) -> int:
        """Draft tokens vLLM verified for the request this step (the scheduler may trim a draft)."""
        if view is not None:
            return view.spec_tokens.get(state.req_id, 0)
        return state.pending.drafted if state.pending is not None else 0

    def _start(self, rid: str, tokens: list[int], prompt_len: int) -> RequestState:
        prompt = tokens[:prompt_len]
        state = RequestState(rid, prompt_len, tokens, last_seen=self.step_no)
        state.drafters = self.pool.for_request(prompt, banks=True)  # LM drafters: 4× faster than transformers' forward
        if self.options.mode == "request":
            # a step where no arm can draft is a plain one its learner does not hear: every request
            # pays the learner's work each step
            state.decider = QueryDecider(
                self.book, copy_learner(self.learner, np.random.default_rng([self.options.seed, self.started])),
                keep_rounds=self.learner.needs.keep, hear_idle=False)
            state.stops = stop_rules(self.arms)
            for i, arm in enumerate(self.arms):
                if arm.route:
                    state.routes[i] = routed_drafter(state.drafters, arm, prompt)
        self.started += 1
        self.states[rid] = state
        return state

    def _finish(self, state: RequestState) -> None:
        self.pool.finish(state.tokens, state.prompt_len, state.drafters)
        if state.decider is not None:
            warm_start(self.learner, state.decider)  # as if requests ran one after another
        stats = state.stats()
        self.finished.append(stats)
        if self.options.log_requests:
            log.info("draftwise request %s: %s", state.req_id, json.dumps(stats))
        if self.options.stats_file:
            with open(self.options.stats_file, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(stats) + "\n")

    # -- feedback ------------------------------------------------------------------------------
    def _feedback(self, state: RequestState, emitted: int, drafted: int, shape: StepShape | None) -> None:
        pending, state.pending = state.pending, None
        if pending is None or not pending.learner:
            return
        if pending.priced is not None and self.acceptance is not None:
            self.acceptance.observe(pending.priced, drafted, accepted_of(emitted, drafted))
        if pending.arm in self.book.models:  # what its drafting cost a token (a draft cut to 0 still paid)
            self.costs.model_token_s.append(pending.draft_s / max(pending.drafted, 1))
            if drafted:
                self.costs.model_verdicts.append((accepted_of(emitted, drafted), drafted))
        if shape is None:
            return
        times = attribute(self.costs.coef, shape, drafted, pending.draft_s, self.options.time_unit)
        record = state.record(pending, emitted, drafted, times.verify, times.draft)
        assert state.decider is not None, "a request's learner chose its pending draft"
        choice = Choice(pending.arm, pending.key)
        reward = state.decider.learn(choice, record)
        state.rounds += 1
        state.reward_sum += float(reward or 0.0)
        if self.options.free_none:  # in plain-step units the no-speculation arm's worth is known every step
            state.decider.credit_plain(choice, record, PLAIN_STEP)

    # -- drafting ------------------------------------------------------------------------------
    def _budget(self, state: RequestState, length: int) -> int:
        return max(0, min(length, self.facts.max_model_len - len(state.tokens) - 1))

    def _propose(self, state: RequestState, index: int, length: int, stop: Any = None) -> Draft:
        drafter = state.drafters[index]
        store = self.pool.stores.get(index)
        if store is not None:
            store.sync(drafter)
        draft = drafter.propose(state.tokens, length, self.ctx, stop)
        return Draft(list(draft.tokens)[:length], match=draft.match)

    def _limits(self, requests: int) -> Limits:
        """What this load allows every request (:func:`~draftwise.decision.core.load_limits`): drafts cut
        to the length that pays most (0: no request drafts); model drafts cut to the length that
        pays counting each drafted token's measured drafting time besides its verification —
        requests draft one after another while the whole batch waits, so under load a model draft
        costs every request its time — and their arms played as ``none`` where no length does."""
        return load_limits(self.costs, self.book, requests, self.options.cap_acceptance, longest=self.draft_len,
                           trim_models=True)

    def _draft(self, state: RequestState, limits: Limits, load: int | None = None) -> list[int]:
        """The request's draft this step: the lookups its learner watches propose, the learner
        chooses within the load's ``limits`` (``load``: the step's requests, for a context that
        holds their bucket), the arm drafts; a draft of a watched lookup is reused, cut."""
        start = self.clock()
        budget = self._budget(state, min(limits.cap, self.draft_len))
        if budget == 0:
            return []
        assert state.decider is not None, "a request's learner chooses its drafts"
        proposals: dict[int, Draft] = {}
        lengths = []
        for index in self.book.watched:
            if index is not None:
                proposals[index] = self._propose(state, index, budget)
            lengths.append(len(proposals[index].tokens) if index is not None else 0)
        choice = state.decider.choose(lengths, state.new_tokens, limits, load=load)
        if choice is None:
            return []  # no arm could draft: a plain step, nothing for the learner to learn
        arm = self.arms[choice.arm]
        draft = Draft([])
        if arm.drafter is not None:
            length = min(limits.length(choice.arm, self.book), budget)
            drafts = [Draft(proposals[i].tokens[:length], match=proposals[i].match)
                      if i in proposals and arm.stop is None
                      else self._propose(state, i, length, state.stops[choice.arm])
                      for i in (state.routes.get(choice.arm, arm.drafter), *arm.also)]
            draft = max(drafts, key=lambda d: len(d.tokens))  # a pick arm's longest draft (ties: the first)
        state.pulls[arm.name] += 1
        lookup = draft.tokens and choice.arm not in self.book.models and arm.stop is None
        # vLLM does not tell the proposer a request's sampling settings: its drafts are keyed as greedy
        priced = draft_key(choice.arm, len(draft.tokens), draft.match, state.new_tokens, True) if lookup else None
        state.pending = Pending(choice.arm, arm.name, min(arm.draft_len, budget), len(draft.tokens),
                                self.clock() - start, choice.key, priced=priced)
        return draft.tokens

    def _admit(self, decode: list[tuple[int, RequestState]], drafts: list[list[int]]) -> None:
        """Cut the step's lookup drafts to the tokens it admits (:func:`~draftwise.decision.pricing.admitted`):
        every draft token ranked by its predicted chance to be accepted (its draft's conditional
        acceptances multiplied up to it), and the number of them with the most expected tokens per
        second of the fitted step a + b·R + c·D admitted (under load a token priced at least as a
        request, b). A lone request drafts as it would alone (optimistic where its drafts are rarely
        seen); under load a token costs the whole batch its time, so only tokens likely kept go in.
        Model drafts are admitted whole (their length was priced before they were drafted)."""
        assert self.acceptance is not None, "drafts are admitted on predicted acceptance"
        rows = len(decode)
        optimism = OPTIMISM if rows == 1 else 0.0
        survivals: list[list[float]] = []
        fixed = 0  # draft tokens not priced here
        for row, state in decode:
            pending, n = state.pending, len(drafts[row])
            if pending is None or pending.priced is None or n == 0:
                survivals.append([])
                fixed += n
            else:
                survivals.append(self.acceptance.survival(pending.priced, n, optimism))
        if not any(survivals):
            return
        a, b, c = self.costs.coef[:3]  # the fitted step a + b·R + c·D (a slot is one more draft token)
        if rows > 1:
            # Under load a draft token is priced at least as a request: each is one more token
            # through the forward, and the fit, whose draft tokens always come with the rows that
            # drafted them, priced one at about half a request (0.5–0.8 against 1.1 ms at 32
            # requests on SmolLM2). So priced, at 32 requests: 0.93 → 0.97× and 0.97 → 0.96× no
            # speculation on zoo:test, 0.87 → 0.90× and 0.90 → 0.90× on self_instruct (two runs
            # each); 4 / 8 / 16 requests 1.28 / 1.15 / 1.09 → 1.34 / 1.16 / 1.08× (2026-11-30)
            c = max(c, b)
        keep = admitted(survivals, lambda tokens: a + b * rows + c * (tokens - rows + fixed))
        for (row, state), k, survival in zip(decode, keep, survivals):
            if survival and k < len(drafts[row]):
                drafts[row] = drafts[row][:k]
                assert state.pending is not None, "a drafted request has its draft pending"
                state.pending = replace(state.pending, drafted=k)

    # -- the batch mode (BanditSpec §6.2) ----------------------------------------------------------
    def _batch_feedback(self, view: BatchView | None, verified: list[tuple[int, RequestState, int]],
                        sampled: Sequence[Sequence[int]], shape: StepShape | None) -> None:
        """The step's throughput per request in plain steps for the length played, and — the same
        drafts cut shorter (:func:`~draftwise.decision.step_costs.cut_round`) — a side observation for every
        shorter length."""
        pending, self.batch_pending = self.batch_pending, None
        outcomes = []
        for row, state, drafted in verified:
            if state.pending is None:
                continue
            outcomes.append((drafted, len(sampled[row]) - 1, len(sampled[row])))
            state.pending = None
        if pending is None or shape is None or not outcomes:
            return
        rows, drafted = len(outcomes), sum(d for d, _, _ in outcomes)

        def record_of(arm: int, cut: CutRound) -> RoundRecord:
            step = replace(shape, draft_tokens=shape.draft_tokens - (drafted - cut.drafted))
            times = batch_times(self.costs.coef, step, rows, pending.draft_s, self.options.time_unit)
            return RoundRecord(index=self.step_no, arm=arm, arm_name=f"len@{self.lengths[arm]}",
                               max_draft=self.lengths[arm], drafted=cut.drafted, accepted=cut.accepted,
                               emitted=cut.emitted, position=0, draft_s=times.draft, verify_s=times.verify)

        shorter = [(arm, self.lengths[arm]) for arm in range(pending.arm - 1, -1, -1)]  # lengths are sorted
        self.load_learners.learn(pending.bucket, pending.arm, outcomes, shorter, record_of)

    def _batch_draft(self, decode: list[tuple[int, RequestState]], drafts: list[list[int]]) -> None:
        if not decode:
            return
        start = self.clock()
        bucket, arm = self.load_learners.choose(len(decode))
        length = self.lengths[arm]
        drafted = 0
        for row, state in decode:
            tokens: list[int] = []
            budget = self._budget(state, length)
            for index in range(len(state.drafters)) if budget else ():
                tokens = self._propose(state, index, budget).tokens
                if tokens:
                    break
            drafts[row] = tokens
            drafted += len(tokens)
            state.pulls[f"len@{length}"] += 1
            state.pending = Pending(arm, f"len@{length}", length, len(tokens), 0.0, learner=False)
        self.batch_pending = Pending(arm, f"len@{length}", length, drafted, self.clock() - start, bucket=bucket)
