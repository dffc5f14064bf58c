"""The drafter pool inside vLLM: templates built once, per-request copies, arms.

* PLD keeps a per-request n-gram index: each request gets a fresh copy.
* Suffix keeps a per-request trie *and* a store of earlier responses shared by every request: a
  request's copy shares the template's store, which grows as requests finish.
* REST reads a datastore and keeps no per-request state: one instance serves every request.
* LM drafters (zoo models or paths) get one KV cache per request (their ``fresh`` copy shares
  the weights); a routed arm (``auto@K``) picks one per request by its fit on the prompt.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from draftwise.arms import NONE, Arm, ArmSettings, build_arms
from draftwise.drafters import (
    DraftContext,
    Drafter,
    ModelDrafter,
    RetrievalDrafter,
    SuffixDrafter,
    build_drafters,
    make_stop_rule,
)
from draftwise.engine.routing import PromptFit
from draftwise.errors import DraftwiseError

log = logging.getLogger(__name__)

class _VocabStub:
    """Stands in for the target model where drafter loading checks the vocabulary size only."""

    def __init__(self, vocab_size: int) -> None:
        import torch

        self._head = torch.nn.Linear(1, max(vocab_size, 1), bias=False)

    def get_output_embeddings(self) -> Any:
        return self._head


def build_templates(specs: Sequence[str], vocab_size: int) -> list[Drafter]:
    """Build every drafter once (bad specs fail here, at start-up)."""
    if not specs:
        return []
    from draftwise.loading import LoadOptions

    return build_drafters(list(specs), _VocabStub(vocab_size), None, LoadOptions())


def default_arms(policy: str, drafters: Sequence[Drafter], draft_len: int) -> str:
    """The arm layout for a policy in vLLM: a preset's own layout; otherwise every drafter at the
    full draft length plus no speculation (the default policy's contexts pick among them).
    LM drafters join as one routed arm (``auto@4``) when there are several."""
    from draftwise.policies import PRESETS

    name = policy.split(":", 1)[0]
    if name in PRESETS:
        return PRESETS.get(name).arms
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
    too_long = [a.name for a in arms if a.draft_len > draft_len]
    if too_long:
        raise DraftwiseError(f"arms {', '.join(too_long)} draft more than num_speculative_tokens={draft_len}; "
                             "raise num_speculative_tokens or shorten the arms")
    return arms


def _is_model(drafter: Drafter) -> bool:
    return isinstance(drafter, ModelDrafter)


def _is_shared(drafter: Drafter) -> bool:
    """Drafters with no per-request state (a datastore lookup) are used as they are."""
    return isinstance(drafter, RetrievalDrafter)


@dataclass
class SuffixStore:
    """A suffix template whose store of earlier responses every request's copy reads."""

    template: SuffixDrafter
    version: int = 0

    def finish(self, tokens: Sequence[int], prompt_len: int) -> None:
        self.template.end_query(tokens, prompt_len)
        self.version += 1

    def sync(self, copy_: SuffixDrafter, seen_version: int) -> int:
        """Point a request's copy at the current store (the template may have rebuilt its trie)."""
        if seen_version != self.version:
            copy_.store, copy_.global_trie = self.template.store, self.template.global_trie
            copy_.global_match = (0, 0)  # its match bound assumed the old store
        return self.version


class DrafterPool:
    """Templates, the suffix stores they share, and per-request copies."""

    def __init__(self, templates: Sequence[Drafter]) -> None:
        self.templates = list(templates)
        self.stores = {i: SuffixStore(d) for i, d in enumerate(self.templates) if isinstance(d, SuffixDrafter)}

    def for_request(self, prompt: Sequence[int]) -> list[Drafter]:
        out: list[Drafter] = []
        for drafter in self.templates:
            if _is_shared(drafter):
                mine = drafter
            elif isinstance(drafter, SuffixDrafter):
                mine = copy.copy(drafter)  # shares the store; begin_query gives it its own trie
            else:
                mine = drafter.fresh()
            mine.begin_query(prompt)
            out.append(mine)
        return out

    def finish(self, tokens: Sequence[int], prompt_len: int) -> None:
        for store in self.stores.values():
            store.finish(tokens, prompt_len)


def route(drafters: Sequence[Drafter], arm: Arm, prompt: Sequence[int]) -> int:
    """The routed arm's drafter for this request: the best top-1 fit on the prompt (the engine's
    prompt fit; ties and prompts too short to judge: the first candidate)."""
    if not arm.route:
        return arm.drafter if arm.drafter is not None else -1
    rates = PromptFit().rates(drafters, prompt, arm.route, DraftContext())
    return max(arm.route, key=lambda i: rates.get(i, 0.0))


def stop_rules(arms: Sequence[Arm]) -> list[Any]:
    """One fresh stopping rule per arm that has one (None elsewhere)."""
    return [make_stop_rule(a.stop) if a.stop else None for a in arms]
