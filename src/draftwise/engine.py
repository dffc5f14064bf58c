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
from draftwise.drafters import Draft, DraftContext, Drafter, LMDrafter, StopRule, make_stop_rule
from draftwise.models import CachedLM
from draftwise.policies import Policy
from draftwise.trace import RoundRecord
from draftwise.verify import Sampling, Verdict, verify_greedy, verify_sampling, warp

log = logging.getLogger(__name__)

# Given the generated tokens so far, the length to keep if a stop string just completed, else None.
StopCheck = Callable[[list[int]], "int | None"]


@dataclass(frozen=True)
class QuerySettings:
    max_new_tokens: int
    sampling: Sampling
    eos_ids: frozenset[int]
    stop_check: StopCheck | None = None


@dataclass
class QueryOutcome:
    tokens: list[int]  # prompt + generated
    records: list[RoundRecord]
    stopped_by: str
    wall_s: float


class Engine:
    """Runs queries with one target, a pool of drafters, a list of arms and a policy."""

    def __init__(self, target: CachedLM, drafters: Sequence[Drafter], arms: Sequence[Arm], policy: Policy) -> None:
        self.target = target
        self.drafters = list(drafters)
        self.arms = list(arms)
        self.policy = policy
        self.rules: list[StopRule | None] = []

    def run(self, prompt: Sequence[int], settings: QuerySettings, generator: torch.Generator) -> QueryOutcome:
        context = list(prompt)
        records: list[RoundRecord] = []
        dctx = DraftContext(settings.sampling, generator, settings.eos_ids)
        stopped_by = "max_new_tokens"
        start = time.perf_counter()
        self.policy.begin_query()
        # stopping rules with state (AdaEDL's threshold) start afresh each query, like the learners
        self.rules = [make_stop_rule(arm.stop) if arm.stop else None for arm in self.arms]
        for drafter in self.drafters:
            drafter.begin_query(context)
        try:
            while (generated := len(context) - len(prompt)) < settings.max_new_tokens:
                record, stop = self._round(len(records), context, generated, settings, dctx)
                records.append(record)
                if stop:
                    stopped_by = stop
                    break
        except KeyboardInterrupt:
            stopped_by = "interrupted"  # what was generated so far is kept and returned
        wall = time.perf_counter() - start
        for drafter in self.drafters:
            drafter.end_query(context, len(prompt))
        return QueryOutcome(context, records, stopped_by, wall)

    def _round(self, index: int, context: list[int], generated: int, settings: QuerySettings, dctx: DraftContext) -> tuple[RoundRecord, str | None]:
        clock = time.perf_counter
        # 1. select an arm
        t0 = clock()
        arm_index = self.policy.select()
        arm = self.arms[arm_index]
        t1 = clock()
        # 2. draft, leaving room for the target's own token within max_new_tokens
        budget = min(arm.draft_len, settings.max_new_tokens - generated - 1)
        draft = self._draft(arm, self.rules[arm_index], context, budget, dctx)
        t2 = clock()
        # 3. verify the whole draft in one target forward
        n = len(draft.tokens)
        logits = self.target.logits(context + draft.tokens, n + 1)  # (n + 1, V)
        target_probs = None if settings.sampling.greedy else warp(logits, settings.sampling)
        verdict = self._verify(draft, logits, target_probs, dctx)
        if self.rules[arm_index] is not None:
            self.rules[arm_index].after_round(n, verdict.accepted)
        new = draft.tokens[: verdict.accepted] + [verdict.next_token]
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
        t3 = clock()
        record = RoundRecord(
            index=index, arm=arm_index, arm_name=arm.name, max_draft=budget, drafted=n,
            accepted=min(verdict.accepted, len(new)), emitted=len(new), position=generated,
            accept_probs=verdict.accept_probs, draft_s=t2 - t1, verify_s=t3 - t2,
        )
        # 4. evaluation phase: every arm's acceptance probabilities along the verified tokens
        if self.policy.full_information:
            record.counterfactual = self.counterfactual(context[:before], new, logits, target_probs, dctx)
        t4 = clock()
        # 5. feedback and update
        record.reward = self.policy.update(arm_index, record)
        t5 = clock()
        record.eval_s, record.policy_s = t4 - t3, (t1 - t0) + (t5 - t4)
        return record, stop

    def _draft(self, arm: Arm, rule: StopRule | None, context: list[int], budget: int, dctx: DraftContext) -> Draft:
        if arm.drafter is None or budget <= 0:
            return Draft([])
        draft = self.drafters[arm.drafter].propose(context, budget, dctx, rule)
        if len(draft.tokens) > budget:  # a drafter must not exceed its budget; trim defensively
            draft = Draft(draft.tokens[:budget], None if draft.probs is None else draft.probs[:budget])
        return draft

    @staticmethod
    def _verify(draft: Draft, logits: torch.Tensor, target_probs: torch.Tensor | None, dctx: DraftContext) -> Verdict:
        if target_probs is None:
            return verify_greedy(draft.tokens, logits)
        return verify_sampling(draft.tokens, draft.probs, target_probs, dctx.generator)

    def counterfactual(
        self,
        context: list[int],
        verified: list[int],
        logits: torch.Tensor,
        target_probs: torch.Tensor | None,
        dctx: DraftContext,
    ) -> list[list[float]]:
        """Per arm, the acceptance probability of its drafter at each verified position.

        Position j is the prediction of ``verified[j]`` from ``context + verified[:j]``; the
        target's distribution there is row j of this round's verification logits, so no extra
        target forward is needed. Arms sharing a drafter share one computation.
        """
        rows = len(verified)
        by_drafter: dict[int | None, list[float]] = {None: [0.0] * rows}
        for arm in self.arms:
            if arm.drafter not in by_drafter:
                by_drafter[arm.drafter] = self._score(self.drafters[arm.drafter], context, verified, logits[:rows],
                                                      None if target_probs is None else target_probs[:rows], dctx)
        return [by_drafter[arm.drafter] for arm in self.arms]

    @staticmethod
    def _score(
        drafter: Drafter,
        context: list[int],
        verified: list[int],
        logits: torch.Tensor,
        target_probs: torch.Tensor | None,
        dctx: DraftContext,
    ) -> list[float]:
        rows = len(verified)
        if isinstance(drafter, LMDrafter):
            q_logits = drafter.next_logits(context + verified[:-1], rows)  # (rows, V): one short prefill
            if target_probs is None:
                return (q_logits.argmax(-1) == logits.argmax(-1)).float().tolist()
            q = warp(q_logits, dctx.sampling)
            return torch.minimum(target_probs, q).sum(-1).tolist()
        # A deterministic drafter: what would it have proposed at each verified position?
        out: list[float] = []
        greedy_choice = logits.argmax(-1).tolist() if target_probs is None else None
        for j in range(rows):
            proposal = drafter.propose(context + verified[:j], 1, dctx).tokens
            if not proposal:
                out.append(0.0)
            elif greedy_choice is not None:
                out.append(float(proposal[0] == greedy_choice[j]))
            else:
                out.append(float(target_probs[j, proposal[0]]))
        return out
