"""The round loop (BanditSpec Alg. 3 / MetaSD Alg. 1): select → draft → verify → accept → feedback.

One target forward per round verifies the whole draft and yields one more target token, so every
round produces at least one token and the output is exactly what the target alone produces.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from draftwise.decision.arms import Arm
from draftwise.decision.core import NO_LIMITS, Choice, Limits, QueryDecider, arm_book
from draftwise.decision.pricing import DraftAcceptance, Key, RoundPrices, draft_key, priced_length
from draftwise.decision.routing import PromptFit, RouteMemory, learn_route, prompt_prior, route
from draftwise.decision.step_costs import PlainRounds
from draftwise.drafters import Draft, Drafter, StopRule, make_stop_rule
from draftwise.engine import evaluation
from draftwise.engine.query import QuerySettings, QueryState, new_query
from draftwise.engine.white_box import HiddenStateFeed
from draftwise.models.costs import CostCurve
from draftwise.models.grad_modes import GradModes, interrupted
from draftwise.policies import Policy
from draftwise.trace import RoundRecord
from draftwise.verify.chain import Verdict, acceptance_probs, verify_greedy, verify_sampling, warp
from draftwise.verify.coupling import CoupledDraw, NoiseScreen, coupled_scores
from draftwise.verify.tree import TreeVerdict, fit_tree, tree_depths, union_of, verify_tree_greedy, verify_tree_sampling

log = logging.getLogger(__name__)

# Every so many priced drafts that would be cut, one is verified whole: what a length not played
# costs and how its later tokens fare would never be measured otherwise (a curve measured on a busy
# machine once priced every long draft out on the toy target: 1.24 vs 1.34× unpriced).
EXPLORE_CUTS = 16


@dataclass
class QueryOutcome:
    tokens: list[int]  # prompt + generated
    records: list[RoundRecord]
    stopped_by: str
    wall_s: float
    extra_target_calls: int = 0  # target forwards outside the rounds (a white-box prompt prefill)


@dataclass
class Planned:
    """A round up to its target forward: the arm (and its context), its draft, and what choosing
    and drafting took."""

    choice: Choice
    draft: Draft
    budget: int  # the draft budget (max tokens) of the round
    policy_s: float
    draft_s: float
    noises: list[float] | None = None  # coupled sampling: each point-mass draft token's own noise (the screen's)
    priced: Key | None = None  # a priced lookup draft: what its acceptance is predicted by

    @property
    def arm(self) -> int:
        return self.choice.arm


@dataclass
class Verified:
    """What one target forward decided about a draft."""

    verdict: Verdict | TreeVerdict
    accepted: list[int]  # the accepted draft tokens, in order
    logits: torch.Tensor  # (rows, V) the target at each verified position
    target_probs: torch.Tensor | None  # (rows, V) its warped distribution (sampling)


class Engine:
    """Runs queries with one target, a pool of drafters, a list of arms and a policy."""

    def __init__(self, target: Any, drafters: Sequence[Drafter], arms: Sequence[Arm], policy: Policy,
                 prompt_fit: PromptFit = PromptFit(), routes: RouteMemory | None = None,
                 keep_rounds: bool = False) -> None:
        self.target = target
        self.drafters = list(drafters)
        self.arms = list(arms)
        self.policy = policy
        self.costs: CostCurve | None = None  # the target's measured costs, refined by the chains it verifies
        self.needs = policy.needs  # what the learner asks of the rounds
        self.prompt_fit = prompt_fit
        # What routing learned across queries (a batch's lanes share their generator's)
        self.routes = routes if routes is not None else RouteMemory()
        self.hidden = HiddenStateFeed(target, self.drafters)
        # What the decisions need of the arms: the no-speculation arm, the model arms, the lookups a
        # contextual learner watches before each choice (draftwise.decision.core)
        self.book = arm_book(self.arms, self.drafters, self.needs.context_on)
        # Keep each query's rounds as its learner heard them, for replay into another learner (a
        # batched query's learner is a copy; see draftwise.engine.batch)
        self.keep_rounds = keep_rounds
        self.last_query: QueryState | None = None  # the latest query (its routed drafters, for inspection)
        self.lasting_rules: dict[int, StopRule] = {}  # arm → a stopping rule that learns across queries
        # What a plain round costs, for learners that hear every round what ``none`` would have earned
        hears = self.book.none is not None and self.needs.hears_plain and not self.needs.full_information
        self.plain_rounds = PlainRounds() if hears else None
        # Coupled sampling: cut a lookup's draft where its own noise says it would be rejected
        # (draftwise.verify.coupling.NoiseScreen; None turns it off). Speed only: the noise decides the text.
        self.noise_screen: NoiseScreen | None = NoiseScreen()
        # A lookup's draft cut to the length that pays most at this machine's prices, from its tokens'
        # predicted acceptance (draftwise.decision.pricing; None turns it off). Needs ``costs``.
        self.pricing: DraftAcceptance | None = DraftAcceptance() if self.needs.priced else None
        self.prices: RoundPrices | None = None  # what whole rounds cost here, from ``costs`` and measured rounds
        self.cuts = 0  # priced drafts cut so far (every EXPLORE_CUTS-th goes uncut)

    # -- a query ------------------------------------------------------------------------------------
    def start(self, prompt: Sequence[int], settings: QuerySettings, generator: torch.Generator | None,
              rng: np.random.Generator | None = None) -> tuple[QueryState, float, float]:
        """A new query: its state, its prompt's prefill and routing. Returns the state and the
        seconds spent on the target (a white-box prefill) and on the drafters (routing, prior).
        ``rng``: the generator the query's learner (and its stopping rules) draw from."""
        decider = QueryDecider(self.book, self.policy, rng=rng, keep_rounds=self.keep_rounds)
        rules = [self._stop_rule(a) for a in range(len(self.arms))]
        routed = [a for a, arm in enumerate(self.arms) if arm.route]
        query = new_query(prompt, settings, generator, [arm.drafter for arm in self.arms], routed, rules, decider)
        self.last_query = query
        for drafter in self.drafters:
            drafter.begin_query(query.context)
        prefill_s = self.hidden.prefill(query)
        setup_start = time.perf_counter()
        if self.needs.full_information or self.needs.prompt_prior > 0:
            self._route(query, query.unrouted)  # every arm's drafter is needed from round 1
        if self.needs.prompt_prior > 0 and self.needs.supports_prior:
            prompt_prior(self.prompt_fit, self.drafters, self.arms, self.policy, query.context, query.arm_drafter,
                         query.dctx)
        return query, prefill_s, time.perf_counter() - setup_start

    def _stop_rule(self, arm_index: int) -> StopRule | None:
        """The arm's stopping rule for a new query: stateful rules (AdaEDL's threshold) start afresh
        each query, like the learners, unless they are ``lasting`` (what they learn carries over)."""
        spec = self.arms[arm_index].stop
        if not spec:
            return None
        if arm_index in self.lasting_rules:
            return self.lasting_rules[arm_index]
        rule = make_stop_rule(spec, self.policy.rng)
        if hasattr(rule, "verify_s") and self.costs is not None:  # a rule that prices its rounds
            rule.verify_s = self.round_prices().seconds
        if rule.lasting:
            self.lasting_rules[arm_index] = rule
        return rule

    def run(self, prompt: Sequence[int], settings: QuerySettings, generator: torch.Generator | None,
            rng: np.random.Generator | None = None) -> QueryOutcome:
        start = time.perf_counter()
        query: QueryState | None = None
        modes = GradModes.now()
        try:
            query, prefill_s, setup_s = self.start(prompt, settings, generator, rng)
            while not query.finished:
                record = self.round(query)
                if len(query.records) == 1:
                    record.verify_s += prefill_s  # target time spent on the prompt, split off round 1
                    record.draft_s += setup_s  # drafters scoring the prompt (routing, prompt prior)
            self.finish(query)
        except BaseException as error:
            # A half-done update (an interrupt inside a forward) must not outlive the query: drop
            # the caches, so the next query starts exact. Ctrl-C keeps what was generated.
            self.recover()
            if not isinstance(error, KeyboardInterrupt) or query is None:
                raise
            query.stopped_by = "interrupted"
            interrupted(error, modes)
        wall = time.perf_counter() - start
        return QueryOutcome(query.context, query.records, query.stopped_by or "max_new_tokens", wall,
                            self.hidden.extra_target_calls(query.prompt_len))

    def finish(self, query: QueryState, end_drafters: bool = True) -> None:
        """The query is over: deliver feedback still pending (when the state outlives the query), and
        tell the drafters (unless they are a batched query's copies: their pool is told)."""
        if query.pending and getattr(query.decider.policy, "keep", False):
            evaluation.deliver(self.drafters, query.decider.policy, query)
        if query.route_fits and query.stopped_by != "interrupted" and not query.settings.sampling.greedy:
            start = time.perf_counter()
            learn_route(self.prompt_fit, self.drafters, self.routes, query.context, query.prompt_len,
                        query.route_fits, query.dctx)
            if query.records:  # drafters' work
                query.records[-1].draft_s += time.perf_counter() - start
        if end_drafters:
            for drafter in self.drafters:
                drafter.end_query(query.context, query.prompt_len)

    def recover(self) -> None:
        """Forget every cache an interrupted forward may have left half-updated (target and drafters)."""
        self.target.reset()
        for drafter in self.drafters:
            drafter.recover()

    # -- a round --------------------------------------------------------------------------------------
    def round(self, query: QueryState) -> RoundRecord:
        """One round of ``query``: select → draft → verify → accept → feedback. Returns its record
        (also appended to ``query.records``); sets ``query.stopped_by`` when the query ends here."""
        plain = self.plain_rounds
        calibrate = plain is not None and bool(query.records) and plain.due()
        planned = self.plan(query, self.book.none if calibrate else None, in_context=calibrate)
        start = time.perf_counter()
        logits = self._target_logits(query, planned.draft)
        forward_s = time.perf_counter() - start
        if self.costs is not None and query.records and planned.draft.parents is None:  # round 1 reads the prompt
            self.costs.observe(len(planned.draft.tokens) + 1, forward_s)
        record = self.conclude(query, planned, logits, forward_s)
        if self.prices is not None and record.index > 0 and (planned.priced is not None or not record.drafted):
            self.prices.observe(record.drafted, record.seconds)
        if plain is not None and record.index > 0:  # round 1 also reads the prompt
            plain.observe(record.seconds, record.drafted)
            seconds = plain.seconds()
            if seconds is not None:
                self.credit_plain(query, planned, record, seconds)
        return record

    def plan(self, query: QueryState, arm_index: int | None = None, in_context: bool = False,
             limits: Limits = NO_LIMITS) -> Planned:
        """Choose an arm (unless the batch chose one for every query) and draft: everything a round
        does before its target forward. ``in_context``: ``arm_index`` is imposed on the learner (a
        calibration round), which still learns it in this round's context; ``limits``: what a
        batch's load allows this round."""
        t0 = time.perf_counter()
        query.dctx.position = len(query.context)  # coupled sampling: where this round's draft starts
        proposed: dict[tuple[int, int], Draft] = {}
        lookup_s = 0.0
        if arm_index is None or in_context:
            choice, lookup_s = self._choose(query, proposed, limits, arm_index)
        else:
            choice = Choice(arm_index)
        t1 = time.perf_counter()
        draft, budget = self._draft(query, choice.arm, limits, proposed)
        draft, noises = self._screen(query, draft)
        priced = self.lookup_key(query, choice.arm, draft) if limits is NO_LIMITS and self.costs is not None else None
        if priced is not None:
            draft, noises = self._price(draft, noises, priced)
        return Planned(choice, draft, budget, t1 - t0 - lookup_s, time.perf_counter() - t1 + lookup_s, noises, priced)

    def plain_plan(self, query: QueryState) -> Planned:
        """A round of ``none`` without drafting or choosing, which the learner does not hear (a
        loaded batch's round in which drafting does not pay: :class:`~draftwise.decision.pricing.DraftGate`)."""
        assert self.book.none is not None and not self.needs.full_information
        query.dctx.position = len(query.context)
        return Planned(Choice(self.book.none, heard=False), Draft([]), 0, 0.0, 0.0)

    def target_input(self, query: QueryState, draft: Draft) -> Any:
        """The round's forward for a batched target row (:class:`~draftwise.models.batched_lm.RowLM`)."""
        if draft.parents is None:
            return self.target.chain_input(query.context + draft.tokens, len(draft.tokens) + 1)
        return self.target.tree_input(query.context, draft.tokens, draft.parents)

    def conclude(self, query: QueryState, planned: Planned, logits: torch.Tensor, forward_s: float,
                 choices: list[int] | None = None, draw: CoupledDraw | None = None) -> RoundRecord:
        """Judge the draft on the target's ``logits``, accept, record and learn: everything a round
        does after its target forward (which took ``forward_s``, this query's share in a batch;
        ``choices``: the target's argmax per row, ``draw``: its coupled draws, when the batch
        computed them for every query at once)."""
        start = time.perf_counter()
        draft, arm_index = planned.draft, planned.arm
        verified = self._judge(query, draft, logits, choices) if draw is None else _drawn(draft, logits, draw)
        if planned.noises is not None and self.noise_screen is not None:
            self.noise_screen.observe(planned.noises, verified.verdict.accepted)
        if planned.priced is not None and self.pricing is not None:
            self.pricing.observe(planned.priced, len(draft.tokens), verified.verdict.accepted)
        before = len(query.context)
        new = self._accept(query, arm_index, draft, verified)
        record = RoundRecord(
            index=len(query.records), arm=arm_index, arm_name=self._arm_name(query, arm_index),
            max_draft=planned.budget, drafted=len(draft.tokens), accepted=min(verified.verdict.accepted, len(new)),
            emitted=len(new), position=before - query.prompt_len, accept_probs=verified.verdict.accept_probs,
            draft_s=planned.draft_s, verify_s=forward_s + time.perf_counter() - start, policy_s=planned.policy_s,
        )
        query.records.append(record)
        rule = query.rules[arm_index]
        if rule is not None:
            rule.after_costs(record.drafted, record.draft_s, forward_s)
        self._feedback(query, planned.choice, record, before, new, verified)
        return record

    def credit_plain(self, query: QueryState, planned: Planned, record: RoundRecord, seconds: float) -> None:
        """Tell the learner what no speculation would have earned in this round: one token for
        ``seconds`` (a plain round's cost, or a plain row's share of the forward;
        :meth:`~draftwise.decision.core.QueryDecider.credit_plain`). Its work counts as the learner's."""
        start = time.perf_counter()
        query.decider.credit_plain(planned.choice, record, seconds)
        record.policy_s += time.perf_counter() - start

    def _target_logits(self, query: QueryState, draft: Draft) -> torch.Tensor:
        """3. one target forward over the draft (chain or tree): rows after the context and after
        each draft token (a tree: each node)."""
        if draft.parents is None:
            return self.target.logits(query.context + draft.tokens, len(draft.tokens) + 1)  # (n + 1, V)
        return self.target.tree_logits(query.context, draft.tokens, draft.parents)  # (n + 1, V)

    def _choose(self, query: QueryState, proposed: dict[tuple[int, int], Draft], limits: Limits,
                imposed: int | None) -> tuple[Choice, float]:
        """1. choose an arm (:meth:`~draftwise.decision.core.QueryDecider.choose`): the lookups the learner's
        context watches propose first, each at the budget of the arm that would draft with it, their
        drafts kept in ``proposed`` for that arm (lookups are deterministic: the same draft). Returns
        the choice and the seconds the lookups took."""
        start = time.perf_counter()
        lengths = []
        for i in self.book.watched:
            if i is None:
                lengths.append(0)
                continue
            budget = self._lookup_budget(query, i, limits)
            draft = self.drafters[i].propose(query.context, budget, query.dctx)
            proposed[(i, budget)] = draft
            lengths.append(len(draft.tokens))
        lookup_s = time.perf_counter() - start
        choice = query.decider.choose(lengths, query.generated, limits, imposed)
        assert choice is not None, "the engine's learners hear every round"
        return choice, lookup_s

    def _lookup_budget(self, query: QueryState, drafter: int, limits: Limits) -> int:
        """The budget a context check proposes at: that of the first plain or pick arm drafting with
        this lookup (so its draft can be reused), else one token."""
        arm = next((i for i, a in enumerate(self.arms)
                    if drafter in a.lookups and a.stop is None and (a.pick or not a.also)), None)
        return max(1, self._budget(query, arm, limits)) if arm is not None else 1

    def _budget(self, query: QueryState, arm_index: int, limits: Limits) -> int:
        return min(limits.length(arm_index, self.book), query.settings.max_new_tokens - query.generated - 1)

    def _draft(self, query: QueryState, arm_index: int, limits: Limits = NO_LIMITS,
               proposed: dict[tuple[int, int], Draft] | None = None) -> tuple[Draft, int]:
        """2. draft, leaving room for the target's own token within max_new_tokens (a lookup's
        draft from the context check is reused when it was proposed at this budget)."""
        arm = self.arms[arm_index]
        if arm_index in query.unrouted:  # routed when first played (drafters' work: counted as drafting)
            self._route(query, [arm_index])
        budget = self._budget(query, arm_index, limits)
        drafter = query.arm_drafter[arm_index]
        if drafter is None or budget <= 0:
            return Draft([]), budget
        rule = query.rules[arm_index]
        draft = self._plain_draft(query, drafter, budget, proposed) if rule is None else \
            self.drafters[drafter].propose(query.context, budget, query.dctx, rule)
        if arm.also:  # several lookups: the longest draft (a pick; ties to the first) or a trie of them all
            drafts = [draft, *(self._plain_draft(query, i, budget, proposed) for i in arm.also)]
            draft = max(drafts, key=lambda d: len(d.tokens)) if arm.pick else union_of(drafts)
        if draft.parents is not None:  # a tree: its depth (the accepted length) is what the budget bounds
            return fit_tree(draft, budget), budget
        if len(draft.tokens) > budget:  # a drafter must not exceed its budget; trim defensively
            probs = None if draft.probs is None else draft.probs[:budget]
            draft = replace(draft, tokens=draft.tokens[:budget], probs=probs)
        return draft, budget

    def _plain_draft(self, query: QueryState, drafter: int, budget: int,
                     proposed: dict[tuple[int, int], Draft] | None) -> Draft:
        """A drafter's draft at ``budget`` without a stopping rule: the context check's when that
        lookup proposed at this budget (lookups are deterministic: the same draft)."""
        known = proposed.get((drafter, budget)) if proposed else None
        return known if known is not None else self.drafters[drafter].propose(query.context, budget, query.dctx)

    def _screen(self, query: QueryState, draft: Draft) -> tuple[Draft, list[float] | None]:
        """2b. under coupled sampling, cut a point-mass chain (a lookup's) before the tokens its own
        noise says would be rejected (:class:`~draftwise.verify.coupling.NoiseScreen`); the noises of the
        tokens kept come back for the screen to learn from the verdict."""
        noise = query.dctx.noise  # set only for sampled queries under coupled sampling
        if noise is None or self.noise_screen is None or not draft.tokens or draft.probs is not None \
                or draft.parents is not None:
            return draft, None
        noises = noise.values(len(query.context), draft.tokens)
        keep = self.noise_screen.cut(noises)
        return (draft if keep == len(draft.tokens) else replace(draft, tokens=draft.tokens[:keep])), noises[:keep]

    def lookup_key(self, query: QueryState, arm_index: int, draft: Draft) -> Key | None:
        """What a lookup's chain draft's acceptance is predicted by (None: not a priced draft — a
        model's, a tree, an empty one — or pricing off)."""
        if self.pricing is None or not draft.tokens or draft.parents is not None or draft.probs is not None \
                or arm_index in self.book.models or self.arms[arm_index].stop:
            return None
        return draft_key(arm_index, len(draft.tokens), draft.match, query.generated, query.settings.sampling.greedy)

    def round_prices(self) -> RoundPrices:
        """What whole rounds cost here (made from ``costs`` when first asked)."""
        assert self.costs is not None, "rounds are priced on the machine's measured curve"
        if self.prices is None:
            self.prices = RoundPrices(self.costs.forward_s)
        return self.prices

    def _price(self, draft: Draft, noises: list[float] | None, key: Key) -> tuple[Draft, list[float] | None]:
        """2c. cut a lookup's draft to the length with the most expected tokens per second
        (:func:`~draftwise.decision.pricing.priced_length`): its tokens' predicted acceptance against
        what a whole round verifying them costs here (:class:`~draftwise.decision.pricing.RoundPrices`)."""
        assert self.pricing is not None
        keep = priced_length(self.pricing.survival(key, len(draft.tokens)), self.round_prices().cost)
        if keep == len(draft.tokens):
            return draft, noises
        self.cuts += 1
        if self.cuts % EXPLORE_CUTS == 0:  # a cut length is never measured: now and then, measure it
            return draft, noises
        return replace(draft, tokens=draft.tokens[:keep]), None if noises is None else noises[:keep]

    def _judge(self, query: QueryState, draft: Draft, logits: torch.Tensor,
               choices: list[int] | None = None) -> Verified:
        """3. verify the whole draft (chain or tree) against the target's rows; they come back
        along the verified path (row j = the target at verified position j). Greedy and coupled
        sampling accept while the draft equals the target's choice (its argmax, or its Gumbel-max
        with the query's noise); rejection sampling accepts by chance against the drafter's q."""
        sampling, generator = query.settings.sampling, query.dctx.generator
        probs = None if sampling.greedy else warp(logits, sampling)
        if probs is not None and query.dctx.noise is None:
            assert generator is not None, "every sampled query has its generator"
            return self._judge_by_rejection(draft, logits, probs, generator)
        scores = logits if probs is None else self._coupled_scores(query, draft, probs)
        choice = choices if probs is None else None  # precomputed argmax: greedy only
        if draft.parents is None:
            verdict = verify_greedy(draft.tokens, scores, choice)
            if probs is not None:  # the learners' signal stays the divergence (1 − TV, p(x̂)) under both schemes
                verdict = replace(verdict, accept_probs=acceptance_probs(draft.tokens, probs, draft.probs).tolist())
            return Verified(verdict, draft.tokens[: verdict.accepted], logits, probs)
        return _along_path(draft, verify_tree_greedy(draft.tokens, draft.parents, scores, choice), logits, probs)

    @staticmethod
    def _judge_by_rejection(draft: Draft, logits: torch.Tensor, probs: torch.Tensor,
                            generator: torch.Generator) -> Verified:
        """Classic speculative sampling (chain) or recursive rejection sampling (tree)."""
        if draft.parents is None:
            verdict = verify_sampling(draft.tokens, draft.probs, probs, generator)
            return Verified(verdict, draft.tokens[: verdict.accepted], logits, probs)
        return _along_path(draft, verify_tree_sampling(draft.tokens, draft.parents, draft.probs, probs, generator),
                           logits, probs)

    @staticmethod
    def _coupled_scores(query: QueryState, draft: Draft, probs: torch.Tensor) -> torch.Tensor:
        """``log p + g`` per verified row, g the noise at the position that row's token takes (a
        chain's row j: the context length + j; a tree's node row: one past the node's depth)."""
        assert query.dctx.noise is not None
        start = len(query.context)
        offsets = range(len(draft.tokens) + 1) if draft.parents is None else [0, *tree_depths(draft.parents)]
        return coupled_scores(probs, query.dctx.noise.rows([start + o for o in offsets], probs.shape[-1]))

    def _accept(self, query: QueryState, arm_index: int, draft: Draft, verified: Verified) -> list[int]:
        """4. accept: the accepted draft plus the target's token, cut at EOS or a stop string."""
        verdict = verified.verdict
        rule = query.rules[arm_index]
        if rule is not None:
            rule.after_round(len(draft.tokens), verdict.accepted, verdict.next_token)
        new = verified.accepted + [verdict.next_token]
        eos_ids = query.settings.eos_ids
        if not eos_ids.isdisjoint(new):  # rare: a set test first, the position only then
            eos = next(i for i, token in enumerate(new) if token in eos_ids)
            new, query.stopped_by = new[: eos + 1], "eos"
        before = len(query.context)
        query.context.extend(new)
        if query.dctx.noise is not None:
            query.dctx.noise.forget_before(len(query.context))
        check = query.settings.stop_check
        if check is not None and query.stopped_by is None:
            keep = check(query.context[query.prompt_len :], len(new))
            if keep is not None:
                del query.context[query.prompt_len + keep :]
                new, query.stopped_by = query.context[before:], "stop_string"
        self.hidden.share(query)
        return new

    def _feedback(self, query: QueryState, choice: Choice, record: RoundRecord, before: int, new: list[int],
                  verified: Verified) -> None:
        """5. feedback (:meth:`~draftwise.decision.core.QueryDecider.learn`). Bandit policies learn now;
        full-information ones once the evaluation phase has scored every drafter on the verified
        tokens, which they may defer and batch (HedgeSpec's skipping updates): deferred rounds are
        delivered later, in order."""
        start = time.perf_counter()
        query.decider.learn(choice, record)
        record.policy_s += time.perf_counter() - start
        policy = query.decider.policy
        if self.needs.full_information:
            evaluation.queue_round(self.drafters, query, record, before, new, verified.logits, verified.target_probs)
            if policy.wants_evaluation(record.index + 1, query.pending_tokens):
                eval_s, policy_s = evaluation.deliver(self.drafters, policy, query)
                record.eval_s += eval_s
                record.policy_s += policy_s

    # -- routing ------------------------------------------------------------------------------------
    def _route(self, query: QueryState, arms: list[int]) -> None:
        prompt = query.context[: query.prompt_len]
        memory = None if query.settings.sampling.greedy else self.routes  # sampled queries learn (RouteMemory)
        query.route_fits.update(route(self.prompt_fit, self.drafters, self.arms, prompt, arms, query.arm_drafter,
                                      query.dctx, memory))
        query.unrouted = [a for a in query.unrouted if a not in arms]

    def _arm_name(self, query: QueryState, arm_index: int) -> str:
        """The arm's name; a routed arm's carries this query's drafter (``auto@4=code``)."""
        arm = self.arms[arm_index]
        drafter = query.arm_drafter[arm_index]
        return f"{arm.name}={self.drafters[drafter].name}" if arm.route and drafter is not None else arm.name


def _drawn(draft: Draft, logits: torch.Tensor, draw: CoupledDraw) -> Verified:
    """A chain judged on coupled draws made for the whole batch (:func:`draftwise.verify.coupling.coupled_draws`):
    accepted while the draft equals the target's draw, as :meth:`Engine._judge` does alone."""
    verdict = replace(verify_greedy(draft.tokens, logits, draw.choices), accept_probs=draw.accept_probs)
    return Verified(verdict, draft.tokens[: verdict.accepted], logits, draw.probs)


def _along_path(draft: Draft, verdict: TreeVerdict, logits: torch.Tensor, probs: torch.Tensor | None) -> Verified:
    """A tree's verdict with the target's rows along the accepted path."""
    rows = verdict.rows
    path_probs = None if probs is None else probs[rows]
    return Verified(verdict, [draft.tokens[i] for i in verdict.path], logits[rows], path_probs)
