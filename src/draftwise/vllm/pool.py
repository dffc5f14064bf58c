"""The drafter pool inside vLLM: templates built once, per-request copies
(:class:`~draftwise.drafters.pool.DrafterPool`), arms; a routed arm (``auto@K``) picks one LM
drafter per request by its fit on the prompt.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from draftwise.decision import NONE, Arm, ArmSettings, build_arms
from draftwise.drafters import (
    Drafter,
    ModelDrafter,
    build_drafters,
    make_stop_rule,
)
from draftwise.errors import DraftwiseError
from draftwise.models.loading import LoadOptions
from draftwise.policies import PolicySpec

log = logging.getLogger(__name__)

class _VocabStub:
    """Stands in for the target model where drafter loading checks the vocabulary size only."""

    def __init__(self, vocab_size: int) -> None:
        self._head = torch.nn.Linear(1, max(vocab_size, 1), bias=False)

    def get_output_embeddings(self) -> Any:
        return self._head


def build_templates(specs: Sequence[str], vocab_size: int) -> list[Drafter]:
    """Build every drafter once (bad specs fail here, at start-up)."""
    if not specs:
        return []
    return build_drafters(list(specs), _VocabStub(vocab_size), None, LoadOptions())


def default_arms(policy: PolicySpec, drafters: Sequence[Drafter], draft_len: int) -> str:
    """The arm layout for a policy in vLLM: a preset's own layout; otherwise every drafter at the
    full draft length plus no speculation (the default policy's contexts pick among them).
    LM drafters join as one routed arm (``auto@4``) when there are several."""
    if policy.preset is not None:
        return str(policy.preset.arms)
    lookups = [d.name for d in drafters if not _is_model(d)]
    models = [d.name for d in drafters if _is_model(d)]
    items = [f"{n}@{draft_len}" for n in lookups]
    if len(models) == 1:
        items.append(f"{models[0]}@{min(4, draft_len)}")
    elif models:
        items.append(f"auto@{min(4, draft_len)}")
    return ",".join(items + [NONE])


def make_arms(layout: str, drafters: Sequence[Drafter], draft_len: int) -> list[Arm]:
    """Arms for ``layout``, every draft length capped at vLLM's ``num_speculative_tokens``."""
    settings = ArmSettings(draft_len=draft_len, max_draft=draft_len)
    arms = build_arms(layout, drafters, settings)
    unions = [a.name for a in arms if a.also and not a.pick]
    if unions:
        raise DraftwiseError(f"arms {', '.join(unions)}: a union drafts a tree, which vLLM does not verify; "
                             "a pick (suffix/pld@K: the longest of the lookups' drafts) is a chain")
    too_long = [a.name for a in arms if a.draft_len > draft_len]
    if too_long:
        raise DraftwiseError(f"arms {', '.join(too_long)} draft more than num_speculative_tokens={draft_len}; "
                             "raise num_speculative_tokens or shorten the arms")
    return arms


def _is_model(drafter: Drafter) -> bool:
    return isinstance(drafter, ModelDrafter)


def stop_rules(arms: Sequence[Arm]) -> list[Any]:
    """One fresh stopping rule per arm that has one (None elsewhere)."""
    return [make_stop_rule(a.stop) if a.stop else None for a in arms]
