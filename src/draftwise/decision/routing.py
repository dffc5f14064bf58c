"""Routing and the prompt prior: how well each drafter predicts the prompt itself.

The prompt fit scores each drafter's top-1 on the last ``window`` prompt tokens, an LM drafter
seeing at most ``lookback`` tokens before them (no target call; drafters on one bank are scored
in one batched forward). A routed arm drafts, for the whole query, with the candidate that fits
best — its prompt fit moved by what routing learned across queries (:class:`RouteMemory`); the
prompt prior turns the fit into a policy's warm start.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from draftwise.decision.arms import Arm
from draftwise.drafters import DraftContext, Drafter
from draftwise.drafters.base import SharedForwards
from draftwise.policies import Policy
from draftwise.policies.feedback import reward_from_acceptance

log = logging.getLogger(__name__)

# On the zoo dev set window 48 / lookback 16 picked the domain's specialist as often as 64/32 (42 vs
# 40 of 56) at about the same cost, and shorter windows picked it less often
# (2026-11-21; docs/design.md, "Routing").
PROMPT_WINDOW = 48
PROMPT_LOOKBACK = 16
# An ended query's answer fit reads its first tokens and needs a few to say anything.
ANSWER_WINDOW = 64
ANSWER_MIN = 8
# λ: how much of a drafter's learned answer-minus-prompt fit moves its prompt fit, and the
# pseudo-queries at no offset the learned mean starts from. Chosen offline on the zoo dev split
# and checked on self_instruct (docs/design.md, "Drafters"): 0.5 and 1.0 agreed within 0.01 on both.
ANSWER_WEIGHT = 0.5
ANSWER_PRIOR_QUERIES = 4.0
# Scoring an answer costs about what routing does (≈ 15 ms on a 2-core CPU for seven small drafters):
# every routed query's until each candidate has ``ANSWER_ALL``, then every ``ANSWER_EVERY``-th one's
# (4 and 1 in 8 learned too slowly: `fixed:auto@3` on self_instruct +3 % instead of +12 %).
ANSWER_ALL = 16
ANSWER_EVERY = 4


@dataclass(frozen=True)
class PromptFit:
    """The prompt-fit signal with its window sizes."""

    window: int = PROMPT_WINDOW
    lookback: int = PROMPT_LOOKBACK

    def rates(self, drafters: Sequence[Drafter], prompt: Sequence[int], which: Sequence[int],
              dctx: DraftContext) -> dict[int, float]:
        """Top-1 accuracy of drafters ``which`` on the prompt's last tokens; empty for a prompt too
        short to judge."""
        window = min(len(prompt) - 1, self.window)
        if window < 2:
            return {}
        shared = SharedForwards()
        return {i: drafters[i].prompt_fit(prompt, window, self.lookback, dctx, shared) for i in which}


class RouteMemory:
    """What routing learns across sampled queries: for each candidate drafter, how much better (or
    worse) it predicts the answers of the queries it was scored on than their prompts.

    A prompt says little about the answer out of the drafters' domains: on self_instruct the prompt
    fit routed 28 of 79 everyday instructions to the code specialist and 7 to translation (1 − TV
    0.61 for the routed pick vs 0.64 for the generalist alone, T 0.7). When a sampled routed query
    ends, every candidate scores its answer (one more batched forward of the drafters, the size of
    routing's; every such query until each candidate has ``ANSWER_ALL``, then one in
    ``ANSWER_EVERY``), and each drafter's mean answer-minus-prompt fit, shrunk toward 0 by a few
    pseudo-queries, is added at ``weight`` to its prompt fit: a specialist whose prompts look like
    its domain but whose answers do not loses its pull (self_instruct: 0.65); in domain the
    drafters' gaps are alike and routing is as before.

    Greedy queries neither learn nor use it: the greedy default routes nearly every query (routing
    took 5.5 % of its wall time on the dev split) and scoring answers cost it 1–6 % more for no gain
    (docs/design.md, "Drafters"). Under coupled sampling the pick changes speed only, never the text."""

    def __init__(self, weight: float = ANSWER_WEIGHT, prior_queries: float = ANSWER_PRIOR_QUERIES) -> None:
        self.weight = weight  # 0: off (routing on the prompt alone, no answer scored)
        self.prior_queries = prior_queries
        self.gap_sum: dict[int, float] = {}  # per drafter: Σ (answer fit − prompt fit) over queries
        self.queries: dict[int, float] = {}
        self.ended = 0  # routed queries that ended, scored or not

    def due(self) -> bool:
        """Score this ended routed query's answer? Every one while the evidence is thin, then one in
        ``ANSWER_EVERY`` (a count, not a draw: no random state)."""
        self.ended += 1
        return min(self.queries.values(), default=0.0) < ANSWER_ALL or self.ended % ANSWER_EVERY == 0

    def offset(self, drafter: int) -> float:
        """What to add to this drafter's prompt fit."""
        n = self.queries.get(drafter, 0.0)
        return self.weight * self.gap_sum.get(drafter, 0.0) / (n + self.prior_queries)

    def observe(self, prompt_rates: dict[int, float], answer_rates: dict[int, float]) -> None:
        for drafter, answer in answer_rates.items():
            if drafter in prompt_rates:
                self.gap_sum[drafter] = self.gap_sum.get(drafter, 0.0) + answer - prompt_rates[drafter]
                self.queries[drafter] = self.queries.get(drafter, 0.0) + 1.0


def best_fit(candidates: Sequence[int], rates: dict[int, float], memory: RouteMemory | None = None) -> int:
    """The candidate with the best prompt fit (a candidate not scored: 0), moved by ``memory``'s
    offset when given; ties to the first."""
    return max(candidates, key=lambda i: rates.get(i, 0.0) + (memory.offset(i) if memory is not None else 0.0))


def routed_drafter(drafters: Sequence[Drafter], arm: Arm, prompt: Sequence[int], fit: PromptFit = PromptFit()) -> int:
    """A routed arm's drafter for one query, from its prompt alone: the candidate with the best top-1 fit
    (ties and prompts too short to judge: the first); an arm that is not routed keeps its drafter (-1: none)."""
    if not arm.route:
        return arm.drafter if arm.drafter is not None else -1
    return best_fit(arm.route, fit.rates(drafters, prompt, arm.route, DraftContext()))


def route(fit: PromptFit, drafters: Sequence[Drafter], arms: Sequence[Arm], prompt: Sequence[int],
          which: Sequence[int], arm_drafter: list[int | None], dctx: DraftContext,
          memory: RouteMemory | None = None) -> dict[int, float]:
    """Pick routed arms ``which``'s drafter (in ``arm_drafter``): the candidate that best predicts the
    prompt, its fit moved by ``memory``'s offset. Returns the candidates' prompt fits."""
    if not which:
        return {}
    rates = fit.rates(drafters, prompt, sorted({i for a in which for i in arms[a].route}), dctx)
    for a in which:
        best = best_fit(arms[a].route, rates, memory)
        arm_drafter[a] = best
        log.debug("arm %s drafts with %s this query", arms[a].name, drafters[best].name)
    return rates


def learn_route(fit: PromptFit, drafters: Sequence[Drafter], memory: RouteMemory, context: Sequence[int],
                prompt_len: int, prompt_rates: dict[int, float], dctx: DraftContext) -> None:
    """An ended query: score the candidates its routing scored on the answer's first tokens (top-1
    on the target's own tokens, as on the prompt) and teach ``memory`` the gap."""
    answer = len(context) - prompt_len
    if not prompt_rates or answer < ANSWER_MIN or memory.weight == 0 or not memory.due():
        return
    window = min(answer, ANSWER_WINDOW)
    seen = context[: prompt_len + window]
    answer_fit = PromptFit(window=window, lookback=fit.lookback)
    memory.observe(prompt_rates, answer_fit.rates(drafters, seen, sorted(prompt_rates), dctx))


def prompt_prior(fit: PromptFit, drafters: Sequence[Drafter], arms: Sequence[Arm], policy: Policy,
                 prompt: Sequence[int], arm_drafter: Sequence[int | None], dctx: DraftContext) -> None:
    """Warm-start the policy from how well each arm's drafter predicts the prompt's own tokens,
    converted into the policy's reward units."""
    rates = fit.rates(drafters, prompt, sorted(i for i in set(arm_drafter) if i is not None), dctx)
    if not rates:
        return
    fit_per_arm = [0.0 if d is None else rates[d] for d in arm_drafter]  # no speculation fits nothing
    needs = policy.needs
    if needs.full_information:
        values = fit_per_arm
    else:
        converted = [reward_from_acceptance(fit, needs.reward, max(arm.draft_len, 1))
                     for fit, arm in zip(fit_per_arm, arms)]
        if any(v is None for v in converted):
            log.info("prompt prior: no acceptance model for reward %r; skipped", needs.reward)
            return
        values = [float(v) for v in converted if v is not None]
    policy.set_prior(values, needs.prompt_prior)
