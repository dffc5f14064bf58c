"""A drafter pool: per-query copies for queries that run side by side (a batch, vLLM's requests), and its
small Llama drafters moved onto shared banks (:func:`attach_banks`).

Copies:

* PLD keeps a per-query n-gram index: each query gets a fresh copy.
* Suffix keeps a per-query trie *and* a store of responses shared by every query: a query's copy
  inserts its response into the shared trie as it grows (concurrent queries draft from each
  other, as SuffixDecoding's global tree does); the template keeps the finished ones for rebuilds.
* ``arctic-suffix`` keeps both in Arctic Inference's cache: each query's copy holds a request there.
* REST reads a datastore and keeps no per-query state: one instance serves every query.
* LM drafters get one KV cache per query (their ``fresh`` copy shares the weights).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from draftwise.drafters.base import Drafter, ModelDrafter
from draftwise.drafters.retrieval import RetrievalDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.models.drafter_bank import LlamaBank, bank_key


def _is_shared(drafter: Drafter) -> bool:
    """Drafters with no per-query state (a datastore lookup) are used as they are."""
    return isinstance(drafter, RetrievalDrafter)


@dataclass
class SuffixStore:
    """A suffix template whose store of earlier responses every query's copy reads."""

    template: SuffixDrafter
    version: int = 0  # responses finished into the store

    def finish(self, tokens: Sequence[int], prompt_len: int) -> None:
        self.template.end_query(tokens, prompt_len, inserted=True)  # the query's copy inserted it live
        self.version += 1

    def sync(self, copy_: SuffixDrafter) -> None:
        """Point a query's copy at the current store: after an eviction the template rebuilt its
        trie, without the responses still growing, so the copy inserts its own again."""
        if copy_.global_trie is not self.template.global_trie:
            copy_.store, copy_.global_trie = self.template.store, self.template.global_trie
            copy_.rejoin()


class DrafterPool:
    """Templates, the suffix stores they share, and per-query copies."""

    def __init__(self, templates: Sequence[Drafter]) -> None:
        self.templates = list(templates)
        self.stores = {i: SuffixStore(d) for i, d in enumerate(self.templates) if isinstance(d, SuffixDrafter)}

    def copies(self) -> list[Drafter]:
        """One query's drafters (call ``begin_query`` on each before use)."""
        out: list[Drafter] = []
        for drafter in self.templates:
            if _is_shared(drafter):
                out.append(drafter)
            elif isinstance(drafter, SuffixDrafter):
                shared = copy.copy(drafter)  # shares the store; begin_query gives it its own trie
                shared.share_live = True
                out.append(shared)
            else:
                out.append(drafter.fresh())
        return out

    def for_request(self, prompt: Sequence[int], banks: bool = False) -> list[Drafter]:
        """One query's drafters, begun on its prompt; ``banks``: its small Llama drafters on the lean
        batched path (:func:`attach_banks`), as the engine runs them."""
        out = self.copies()
        if banks:
            attach_banks(out)
        for drafter in out:
            drafter.begin_query(prompt)
        return out

    def finish(self, tokens: Sequence[int], prompt_len: int, copies: Sequence[Drafter] | None = None) -> None:
        """A query finished: the suffix stores grow; every other drafter ends the query — its copy
        (``copies``, the query's own) where it has one, for a copy may hold the query's part of a
        shared store (``arctic-suffix``'s request in its cache)."""
        for index, drafter in enumerate(self.templates):
            if index in self.stores:
                self.stores[index].finish(tokens, prompt_len)
            else:
                (copies[index] if copies is not None else drafter).end_query(tokens, prompt_len)

    def refresh(self, drafters: Sequence[Drafter]) -> None:
        """Point a query's suffix copies at their stores as they are now."""
        for index, store in self.stores.items():
            drafter = drafters[index]
            assert isinstance(drafter, SuffixDrafter)
            store.sync(drafter)


def attach_banks(drafters: Sequence[Any], head_dtype: str | torch.dtype | None = None) -> list[LlamaBank]:
    """Move model drafters of one Llama shape onto shared banks (the others stay as they are)."""
    groups: dict[tuple, list[ModelDrafter]] = {}
    for drafter in drafters:
        model = drafter.hf_model() if isinstance(drafter, ModelDrafter) else None
        if model is not None and (key := bank_key(model)) is not None:
            groups.setdefault(key, []).append(drafter)
    banks = []
    for members in groups.values():
        bank = LlamaBank([d.hf_model() for d in members], head_dtype)
        for slot, drafter in enumerate(members):
            drafter.join_bank(bank, slot)
        banks.append(bank)
    return banks
