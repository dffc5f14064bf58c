"""The round loop (BanditSpec Alg. 3 / MetaSD Alg. 1): select → draft → verify → feedback → record.

One target forward per round verifies the whole draft and yields one more target token, so every
round produces at least one token and the output is exactly what the target alone produces.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from draftwise.arms import Arm
from draftwise.feedback import reward_from_acceptance
from draftwise.drafters import Draft, DraftContext, Drafter, LMDrafter, StopRule, make_stop_rule
from draftwise.drafters.whitebox import WhiteBoxDrafter
from draftwise.models import CachedLM
from draftwise.policies import Policy
from draftwise.trace import RoundRecord
from draftwise.tree import TreeVerdict, fit_tree, verify_tree_greedy, verify_tree_sampling
from draftwise.verify import Sampling, Verdict, top1_hits, verify_greedy, verify_sampling, warp

log = logging.getLogger(__name__)

# The prompt fit (routing, prompt prior) scores each drafter's top-1 on the last PROMPT_WINDOW
# prompt tokens, seeing at most PROMPT_CONTEXT tokens before them: on the zoo dev set 48/16
# picked the domain's specialist as often as 64/32 (42 vs 40 of 56) at about the same cost, and
# shorter windows picked it less often (benchmarks/prompt_fit.py, BENCHMARKS.md).
PROMPT_WINDOW = 48
PROMPT_CONTEXT = 16

# Given the generated tokens so far, the length to keep if a stop string just completed, else None.
StopCheck = Callable[[list[int]], "int | None"]


@dataclass(frozen=True)
class QuerySettings:
    max_new_tokens: int
    sampling: Sampling
    eos_ids: frozenset[int]
    stop_check: StopCheck | None = None


@dataclass
class PendingRound:
    """A round whose evaluation phase has not run yet."""

    record: RoundRecord
    start: int  # context length before the round's verified tokens
    rows: int  # verified tokens of the round
    choice: list[int]  # the target's argmax at those positions
    probs: torch.Tensor | None  # (rows, V) the warped target distribution (sampling)
    proposals: dict[int, list[int | None]]  # deterministic drafters' proposals at each position


@dataclass
class QueryOutcome:
    tokens: list[int]  # prompt + generated
    records: list[RoundRecord]
    stopped_by: str
    wall_s: float
    extra_target_calls: int = 0  # target forwards outside the rounds (a white-box prompt prefill)


class Engine:
    """Runs queries with one target, a pool of drafters, a list of arms and a policy."""

    def __init__(self, target: CachedLM, drafters: Sequence[Drafter], arms: Sequence[Arm], policy: Policy) -> None:
        self.target = target
        self.drafters = list(drafters)
        self.arms = list(arms)
        # each arm's drafter this query (a routed arm's is picked at the start of every query)
        self.arm_drafter: list[int | None] = [arm.drafter for arm in self.arms]
        self.played = set(self.arm_drafter)  # drafters behind some arm
        self.policy = policy
        # Contextual policies see, before each choice, which of the drafters they name have a
        # proposal: one entry per name (None: not in the pool, never proposes); none in the pool,
        # no context at all.
        names = [d.name for d in self.drafters]
        named = [names.index(n) if n in names else None for n in getattr(policy, "context_on", ())]
        self.context_drafters = named if any(i is not None for i in named) else []
        self.rules: list[StopRule | None] = []
        self.pending: list[PendingRound] = []
        self.pending_tokens = 0
        # White-box drafters read the target's final hidden states, recorded during verification.
        self.white_box = [i for i, d in enumerate(self.drafters) if getattr(d, "reads_target_hidden", False)]
        self.unrouted: list[int] = []  # routed arms whose drafter this query is not picked yet
        self.hidden_sent = 0  # positions of the query whose hidden states the white-box drafters have
        if self.white_box:
            target.keep_hidden = True

    def run(self, prompt: Sequence[int], settings: QuerySettings, generator: torch.Generator) -> QueryOutcome:
        context = list(prompt)
        records: list[RoundRecord] = []
        dctx = DraftContext(settings.sampling, generator, settings.eos_ids)
        stopped_by = "max_new_tokens"
        start = time.perf_counter()
        self.policy.begin_query()
        self.pending, self.pending_tokens = [], 0
        # stopping rules with state (AdaEDL's threshold) start afresh each query, like the learners
        self.rules = [make_stop_rule(arm.stop, self.policy.rng) if arm.stop else None for arm in self.arms]
        for drafter in self.drafters:
            drafter.begin_query(context)
        prefill_s = self._prefill_for_white_box(context)
        setup_start = time.perf_counter()
        self.unrouted = [a for a, arm in enumerate(self.arms) if arm.route]
        if self.policy.full_information or self.policy.prompt_prior > 0:
            self._route(context, self.unrouted, dctx)  # every arm's drafter is needed from round 1
        if self.policy.prompt_prior > 0 and self.policy.supports_prior:
            self._warm_start_from_prompt(context, dctx)
        setup_s = time.perf_counter() - setup_start
        try:
            while (generated := len(context) - len(prompt)) < settings.max_new_tokens:
                record, stop = self._round(len(records), context, generated, settings, dctx)
                if not records:
                    record.verify_s += prefill_s  # target time spent on the prompt, split off round 1
                    record.draft_s += setup_s  # drafters scoring the prompt (routing, prompt prior)
                records.append(record)
                if stop:
                    stopped_by = stop
                    break
            if self.pending and getattr(self.policy, "keep", False):  # state outlives the query: flush
                self._deliver_pending(context, dctx)
        except KeyboardInterrupt:
            stopped_by = "interrupted"  # what was generated so far is kept and returned
        wall = time.perf_counter() - start
        for drafter in self.drafters:
            drafter.end_query(context, len(prompt))
        # the white-box prompt prefill is a target call of its own: count it
        extra_calls = 1 if self.white_box and len(prompt) > 1 else 0
        return QueryOutcome(context, records, stopped_by, wall, extra_calls)

    def _round(self, index: int, context: list[int], generated: int, settings: QuerySettings, dctx: DraftContext) -> tuple[RoundRecord, str | None]:
        clock = time.perf_counter
        # 1. select an arm (a contextual policy first learns which lookups have a proposal here)
        t0 = clock()
        if self.context_drafters:
            self.policy.set_context(tuple(i is not None and bool(self.drafters[i].propose(context, 1, dctx).tokens)
                                          for i in self.context_drafters))
        arm_index = self.policy.select()
        arm = self.arms[arm_index]
        t1 = clock()
        if arm_index in self.unrouted:  # routed when first played (drafters' work: counted as drafting)
            self._route(context[: len(context) - generated], [arm_index], dctx)
        # 2. draft, leaving room for the target's own token within max_new_tokens
        budget = min(arm.draft_len, settings.max_new_tokens - generated - 1)
        draft = self._draft(self.arm_drafter[arm_index], arm, self.rules[arm_index], context, budget, dctx)
        t2 = clock()
        # 3. verify the whole draft (chain or tree) in one target forward
        n = len(draft.tokens)
        if draft.parents is None:
            logits = self.target.logits(context + draft.tokens, n + 1)  # (n + 1, V)
            target_probs = None if settings.sampling.greedy else warp(logits, settings.sampling)
            verdict = self._verify(draft, logits, target_probs, dctx)
            accepted = draft.tokens[: verdict.accepted]
        else:
            logits, target_probs, verdict = self._verify_tree(draft, context, settings.sampling, dctx)
            accepted = [draft.tokens[i] for i in verdict.path]
        if self.rules[arm_index] is not None:
            self.rules[arm_index].after_round(n, verdict.accepted, verdict.next_token)
        new = accepted + [verdict.next_token]
        stop = None
        for i, token in enumerate(new):
            if token in settings.eos_ids:
                new, stop = new[: i + 1], "eos"
                break
        before = len(context)
        context.extend(new)
        if settings.stop_check is not None and stop is None:
            keep = settings.stop_check(context[before - generated :])
            if keep is not None:
                del context[before - generated + keep :]
                new, stop = context[before:], "stop_string"
        self._share_hidden(context)
        t3 = clock()
        record = RoundRecord(
            index=index, arm=arm_index, arm_name=self._arm_name(arm_index), max_draft=budget, drafted=n,
            accepted=min(verdict.accepted, len(new)), emitted=len(new), position=generated,
            accept_probs=verdict.accept_probs, draft_s=t2 - t1, verify_s=t3 - t2,
        )
        # 4. feedback. Bandit policies learn now; full-information ones once the evaluation phase
        # has scored every drafter on the verified tokens, which they may defer and batch
        # (HedgeSpec's skipping updates): deferred rounds are delivered later, in order.
        if self.policy.full_information:
            self._queue_evaluation(record, context, before, new, logits, target_probs, dctx)
            if self.policy.wants_evaluation(index + 1, self.pending_tokens):
                eval_s, policy_s = self._deliver_pending(context, dctx)
                record.eval_s += eval_s
                record.policy_s += policy_s
        else:
            t4 = clock()
            record.reward = self.policy.update(arm_index, record)
            record.policy_s += clock() - t4
        record.policy_s += t1 - t0
        return record, stop

    def _arm_name(self, arm_index: int) -> str:
        """The arm's name; a routed arm's carries this query's drafter (``auto@4=code``)."""
        arm = self.arms[arm_index]
        return f"{arm.name}={self.drafters[self.arm_drafter[arm_index]].name}" if arm.route else arm.name

    # -- white-box drafters: the target's hidden states ------------------------------------------------
    def _prefill_for_white_box(self, prompt: list[int]) -> float:
        """Run the prompt (all but its last token) through the target before round 1, when the pool has
        white-box drafters: they need its hidden states to draft in round 1 (and to be scored by the
        prompt prior). Round 1 then feeds only the last prompt token and the draft, so every prompt
        token is still computed once — in two target calls instead of one. Returns the seconds spent."""
        self.hidden_sent = 0
        if not self.white_box:
            return 0.0
        start = time.perf_counter()
        if len(prompt) > 1:
            self.target.logits(prompt[:-1], 1)
        self._share_hidden(prompt)
        return time.perf_counter() - start

    def _share_hidden(self, context: list[int]) -> None:
        """Hand the white-box drafters the target's hidden states of the newly verified positions.

        Every position but the last has one (the last token is the target's own, read next round);
        they come from the verification forward (a tree's accepted path is gathered first), so
        this costs no target computation.
        """
        if not self.white_box:
            return
        known = len(context) - 1
        start = min(self.hidden_sent, known)  # a stop string may have cut the context back
        rows = self.target.hidden_states(context, start, known)
        for i in self.white_box:
            self.drafters[i].observe_target(context, rows, start)
        self.hidden_sent = known

    # -- the prompt prior --------------------------------------------------------------------------
    def _prompt_fit(self, prompt: list[int], which: Sequence[int], dctx: DraftContext) -> dict[int, float]:
        """Each drafter's top-1 accuracy on the last ``PROMPT_WINDOW`` prompt tokens: a cheap
        domain-fit signal, no target call (LM drafters prefill the prompt anyway to draft; a bank
        does it for all of them in one batched forward). Empty for a prompt too short to judge."""
        window = min(len(prompt) - 1, PROMPT_WINDOW)
        if window < 2:
            return {}
        targets = torch.tensor(prompt[len(prompt) - window :])
        # LM drafters read only the tail (their caches follow any context); white-box heads need the
        # hidden states of the whole prompt, and lookups the whole stream (their state only grows).
        recent = prompt[-(window + PROMPT_CONTEXT + 1) :]
        rates: dict[int, float] = {}
        banked: dict[int, torch.Tensor] = {}  # per bank: every member's top-1 hits, from one batched forward
        for i in which:
            drafter = self.drafters[i]
            bank = getattr(drafter, "bank", None)
            if bank is not None:
                if id(bank) not in banked:
                    banked[id(bank)] = bank.top1_all(recent[:-1], targets)
                rates[i] = float(banked[id(bank)][drafter.lm.slot].float().mean())
            elif _scored_by_logits(drafter):
                seen = recent if isinstance(drafter, LMDrafter) else prompt
                rates[i] = float(top1_hits(drafter.next_logits(seen[:-1], window), targets).float().mean())
            else:
                guesses = drafter.first_tokens_along(prompt[: len(prompt) - window], prompt[len(prompt) - window :], dctx)
                rates[i] = sum(g == t for g, t in zip(guesses, targets.tolist())) / window
        return rates

    def _route(self, prompt: list[int], arms: list[int], dctx: DraftContext) -> None:
        """Pick these routed arms' drafter for this query: the candidate that best predicts the prompt."""
        if arms:
            rates = self._prompt_fit(prompt, sorted({i for a in arms for i in self.arms[a].route}), dctx)
            for a in arms:
                self.arm_drafter[a] = max(self.arms[a].route, key=lambda i: rates.get(i, 0.0))  # ties: the first
                log.debug("arm %s drafts with %s this query", self.arms[a].name, self.drafters[self.arm_drafter[a]].name)
            self.unrouted = [a for a in self.unrouted if a not in arms]
        self.played = set(self.arm_drafter)

    def _warm_start_from_prompt(self, prompt: list[int], dctx: DraftContext) -> None:
        """Warm-start the policy from how well each arm's drafter predicts the prompt's own tokens
        (see ``_prompt_fit``), converted into the policy's reward units."""
        fit = self._prompt_fit(prompt, sorted(i for i in self.played if i is not None), dctx)
        if not fit:
            return
        rates: dict[int | None, float] = {None: 0.0, **fit}
        if self.policy.full_information:
            values = [rates[d] for d in self.arm_drafter]
        else:
            converted = [reward_from_acceptance(rates[d], self.policy.reward, max(arm.draft_len, 1))
                         for d, arm in zip(self.arm_drafter, self.arms)]
            if any(v is None for v in converted):
                log.info("prompt prior: no acceptance model for reward %r; skipped", self.policy.reward)
                return
            values = [float(v) for v in converted]
        self.policy.set_prior(values, self.policy.prompt_prior)

    # -- the evaluation phase (full-information feedback) ----------------------------------------
    def _deliver_pending(self, context: list[int], dctx: DraftContext) -> tuple[float, float]:
        """Evaluate the pending rounds, then give each record to the policy in order.

        Returns the seconds spent evaluating and updating."""
        t0 = time.perf_counter()
        self._evaluate(context, dctx)
        t1 = time.perf_counter()
        for item in self.pending:
            item.record.reward = self.policy.update(item.record.arm, item.record)
        self.pending, self.pending_tokens = [], 0
        return t1 - t0, time.perf_counter() - t1

    def _queue_evaluation(self, record: RoundRecord, context: list[int], before: int, new: list[int],
                          logits: torch.Tensor, target_probs: torch.Tensor | None, dctx: DraftContext) -> None:
        start = time.perf_counter()
        rows = len(new)
        # Deterministic drafters answer now, while their state has seen exactly this prefix.
        proposals = {i: d.first_tokens_along(context[:before], new, dctx)
                     for i, d in enumerate(self.drafters) if not _scored_by_logits(d) and self._evaluated(i)}
        # Under greedy decoding the verified tokens *are* the target's argmax at their positions.
        choice = list(new) if target_probs is None else logits[:rows].argmax(-1).tolist()
        self.pending.append(PendingRound(record, before, rows, choice,
                                         None if target_probs is None else target_probs[:rows], proposals))
        self.pending_tokens += rows
        record.eval_s += time.perf_counter() - start

    def _evaluated(self, drafter: int) -> bool:
        """Is this drafter behind some arm (so its counterfactual feedback is needed)?"""
        return drafter in self.played

    def _evaluate(self, context: list[int], dctx: DraftContext) -> None:
        """Fill ``counterfactual`` of every pending round: arm i's acceptance probability at each
        verified position. The target's distribution there came with that round's verification (its
        argmax, and its warped probabilities when sampling), so no extra target forward is needed;
        each LM drafter catches up on all pending tokens in one short prefill; arms sharing a drafter
        share one computation."""
        first, total = self.pending[0].start, self.pending_tokens
        chosen = [c for p in self.pending for c in p.choice]  # the target's argmax, as Python ints
        greedy = self.pending[0].probs is None
        probs = None if greedy else torch.cat([p.probs for p in self.pending])
        choice: torch.Tensor | None = None  # ``chosen`` as a tensor, made once if a model drafter needs it
        scores: dict[int | None, list[float]] = {None: [0.0] * total}
        batched: dict[int, torch.Tensor] = {}  # per drafter bank: every member's logits in one forward
        prefix = context[: first + total - 1]
        for i, drafter in enumerate(self.drafters):
            if not self._evaluated(i):
                continue
            if _scored_by_logits(drafter):  # LM and white-box drafters: one short forward over the pending tokens
                q_logits = _drafter_logits(drafter, prefix, total, batched)  # (total, V)
                if choice is None:
                    choice = torch.tensor(chosen, device=q_logits.device)
                scores[i] = drafter.acceptance_along(q_logits, choice, probs, dctx.sampling)  # chain or tree
            else:
                proposed = [tok for p in self.pending for tok in p.proposals[i]]
                if greedy:
                    scores[i] = [float(tok == best) for tok, best in zip(proposed, chosen)]
                else:  # the target's probability of each proposal, gathered at once
                    mass = probs[torch.arange(total), torch.tensor([-1 if t is None else t for t in proposed])].tolist()
                    scores[i] = [0.0 if tok is None else m for tok, m in zip(proposed, mass)]
        offset = 0
        for item in self.pending:
            item.record.counterfactual = [scores[d][offset : offset + item.rows] for d in self.arm_drafter]
            offset += item.rows

    def _draft(self, drafter: int | None, arm: Arm, rule: StopRule | None, context: list[int], budget: int,
               dctx: DraftContext) -> Draft:
        if drafter is None or budget <= 0:
            return Draft([])
        draft = self.drafters[drafter].propose(context, budget, dctx, rule)
        if draft.parents is not None:  # a tree: its depth (the accepted length) is what the budget bounds
            return fit_tree(draft, budget)
        if len(draft.tokens) > budget:  # a drafter must not exceed its budget; trim defensively
            draft = Draft(draft.tokens[:budget], None if draft.probs is None else draft.probs[:budget])
        return draft

    def _verify_tree(self, draft: Draft, context: list[int], sampling: Sampling,
                     dctx: DraftContext) -> tuple[torch.Tensor, torch.Tensor | None, TreeVerdict]:
        """Verify a tree in one forward; the target's rows come back along the verified path
        (row j = the target at verified position j), as a chain's would."""
        logits = self.target.tree_logits(context, draft.tokens, draft.parents)  # (n + 1, V)
        if sampling.greedy:
            verdict = verify_tree_greedy(draft.tokens, draft.parents, logits)
            return logits[verdict.rows], None, verdict
        target_probs = warp(logits, sampling)
        verdict = verify_tree_sampling(draft.tokens, draft.parents, draft.probs, target_probs, dctx.generator)
        return logits[verdict.rows], target_probs[verdict.rows], verdict

    @staticmethod
    def _verify(draft: Draft, logits: torch.Tensor, target_probs: torch.Tensor | None, dctx: DraftContext) -> Verdict:
        if target_probs is None:
            return verify_greedy(draft.tokens, logits)
        return verify_sampling(draft.tokens, draft.probs, target_probs, dctx.generator)


def _scored_by_logits(drafter: Drafter) -> bool:
    """LM and white-box drafters give their distribution at every verified position (``next_logits``);
    deterministic ones are asked what they would have proposed."""
    return isinstance(drafter, (LMDrafter, WhiteBoxDrafter))


def _drafter_logits(drafter: Drafter, prefix: list[int], n_out: int, batched: dict[int, torch.Tensor]) -> torch.Tensor:
    """A drafter's logits (n_out, V) after ``prefix``: one short prefill of its own, or — for a
    drafter on a LlamaBank — its row of one batched forward of the whole bank, computed once
    per bank and kept in ``batched``."""
    bank = getattr(drafter, "bank", None)
    if bank is None:
        return drafter.next_logits(prefix, n_out)
    if id(bank) not in batched:
        batched[id(bank)] = bank.sync_all(prefix, n_out)  # (members, n_out, V)
    return batched[id(bank)][drafter.lm.slot]
