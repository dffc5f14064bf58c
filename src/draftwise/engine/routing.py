"""Routing and the prompt prior: how well each drafter predicts the prompt itself.

The prompt fit scores each drafter's top-1 on the last ``window`` prompt tokens, an LM drafter
seeing at most ``lookback`` tokens before them (no target call; drafters on one bank are scored
in one batched forward). A routed arm drafts, for the whole query, with the candidate that fits
best; the prompt prior turns the fit into a policy's warm start.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from draftwise.arms import Arm
from draftwise.drafters import DraftContext, Drafter
from draftwise.drafters.base import SharedForwards
from draftwise.feedback import reward_from_acceptance
from draftwise.policies import Policy

log = logging.getLogger(__name__)

# On the zoo dev set window 48 / lookback 16 picked the domain's specialist as often as 64/32 (42 vs
# 40 of 56) at about the same cost, and shorter windows picked it less often
# (benchmarks/prompt_fit.py, BENCHMARKS.md).
PROMPT_WINDOW = 48
PROMPT_LOOKBACK = 16


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


def route(fit: PromptFit, drafters: Sequence[Drafter], arms: Sequence[Arm], prompt: Sequence[int],
          which: Sequence[int], arm_drafter: list[int | None], dctx: DraftContext) -> None:
    """Pick routed arms ``which``'s drafter (in ``arm_drafter``): the candidate that best predicts the prompt."""
    if not which:
        return
    rates = fit.rates(drafters, prompt, sorted({i for a in which for i in arms[a].route}), dctx)
    for a in which:
        best = max(arms[a].route, key=lambda i: rates.get(i, 0.0))  # ties: the first
        arm_drafter[a] = best
        log.debug("arm %s drafts with %s this query", arms[a].name, drafters[best].name)


def prompt_prior(fit: PromptFit, drafters: Sequence[Drafter], arms: Sequence[Arm], policy: Policy,
                 prompt: Sequence[int], arm_drafter: Sequence[int | None], dctx: DraftContext) -> None:
    """Warm-start the policy from how well each arm's drafter predicts the prompt's own tokens,
    converted into the policy's reward units."""
    rates = fit.rates(drafters, prompt, sorted(i for i in set(arm_drafter) if i is not None), dctx)
    if not rates:
        return
    fit_per_arm = [0.0 if d is None else rates[d] for d in arm_drafter]  # no speculation fits nothing
    if policy.full_information:
        values = fit_per_arm
    else:
        converted = [reward_from_acceptance(fit, policy.reward, max(arm.draft_len, 1))
                     for fit, arm in zip(fit_per_arm, arms)]
        if any(v is None for v in converted):
            log.info("prompt prior: no acceptance model for reward %r; skipped", policy.reward)
            return
        values = [float(v) for v in converted if v is not None]
    policy.set_prior(values, policy.prompt_prior)
