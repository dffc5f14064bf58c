"""REST-style retrieval drafter: continuations looked up in a suffix-array datastore.

The datastore (:mod:`draftwise.retrieval.datastore`) is a stream of token ids with its suffix array. To draft:

1. find the longest suffix of the context (≤ ``max_match`` tokens) that occurs in the stream: a
   binary search on the length, since an occurring suffix implies every shorter one occurs; each
   test narrows the suffix array's range token by token (:mod:`draftwise.retrieval.suffix_array`);
2. take the occurrences in that range — a deterministic, evenly spaced sample of at most
   ``sample`` of them — and the tokens that follow each one (up to its document's end);
3. the occurrences are sorted by what follows them, so equal continuations are neighbours:
   follow the most frequent next token while the path's estimated probability stays ≥
   ``min_prob`` (a chain, ``probs=None``), or count every continuation n-gram for a tree of
   candidates (:meth:`RetrievalDrafter.candidates`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from draftwise.drafters.base import DRAFTERS, Draft, DraftContext, Drafter
from draftwise.errors import DraftwiseError
from draftwise.retrieval.datastore import Datastore
from draftwise.retrieval.suffix_array import (
    Continuation,
    Match,
    continuation_tree,
    count_prefixes,
    greedy_chain,
    top_continuations,
)


@DRAFTERS.register("rest")
class RetrievalDrafter(Drafter):
    """Most frequent continuation of the context's longest suffix found in a datastore (REST)."""

    def __init__(
        self,
        *,
        store: str | Datastore = "",
        max_match: int = 16,
        min_match: int = 1,
        sample: int = 128,
        min_prob: float = 0.1,
        tree: int = 0,
        name: str = "rest",
    ) -> None:
        if not store:
            raise DraftwiseError(
                "rest: needs store=DIR, a datastore folder (build one with 'draftwise datastore build')")
        if max_match < 1 or not 1 <= min_match <= max_match or sample < 1 or not 0 <= min_prob <= 1 or tree < 0:
            raise DraftwiseError(
                "rest: need max_match ≥ 1, 1 ≤ min_match ≤ max_match, sample ≥ 1, 0 ≤ min_prob ≤ 1, tree ≥ 0 "
                f"(got max_match={max_match}, min_match={min_match}, sample={sample}, min_prob={min_prob}, tree={tree})"
            )
        self.name = name
        self.store = store
        self.max_match, self.min_match, self.sample, self.min_prob = max_match, min_match, sample, min_prob
        self.tree = tree  # > 0: draft a tree of this many nodes instead of a chain
        self.datastore = store if isinstance(store, Datastore) else Datastore.load(store)
        self.vocab_size: int | None = self.datastore.meta.get("vocab_size")

    def fresh(self) -> RetrievalDrafter:
        return copy.deepcopy(self, {id(self.datastore): self.datastore})  # the (memory-mapped) store is shared

    def match(self, context: Sequence[int]) -> Match | None:
        """The longest matched suffix of ``context``, or None when shorter than ``min_match``."""
        found = self.datastore.longest_match(context, self.max_match)
        return found if found.length >= self.min_match else None

    def propose(self, context: Sequence[int], max_len: int, ctx: DraftContext, stop: Any = None) -> Draft:
        """The most frequent continuation as a chain; with ``tree`` > 0, a tree of the ``tree``
        most frequent continuation prefixes (no ``min_prob`` cut; depth ≤ ``max_len``)."""
        found = self.match(context) if max_len > 0 else None
        if found is None:
            return Draft([])
        rows = self.datastore.windows(found, max_len, self.sample)
        if not self.tree:
            return Draft(greedy_chain(rows, max_len, self.min_prob, ctx.eos_ids))
        tokens, parents = continuation_tree(_before_eos(count_prefixes(rows), ctx.eos_ids), self.tree)
        return Draft(tokens, parents=parents) if tokens else Draft([])

    def candidates(
        self, context: Sequence[int], max_len: int, nodes: int = 16, eos_ids: frozenset[int] = frozenset()
    ) -> list[Continuation]:
        """Several continuations with their counts: the root-to-leaf paths of the ``nodes`` most
        frequent continuation prefixes (the tree the ``tree`` option drafts). Paths stop after an EOS."""
        found = self.match(context) if max_len > 0 else None
        if found is None:
            return []
        counts = count_prefixes(self.datastore.windows(found, max_len, self.sample))
        return top_continuations(_before_eos(counts, eos_ids), nodes)

    def describe(self) -> dict[str, Any]:
        meta = self.datastore.meta
        where = self.datastore.path
        return {**super().describe(), "store": str(where) if where else "(in memory)", "max_match": self.max_match,
                "min_match": self.min_match, "sample": self.sample, "min_prob": self.min_prob, "tree": self.tree,
                "store_tokens": meta.get("tokens"), "store_documents": meta.get("documents"),
                "tokenizer": meta.get("tokenizer")}


def _before_eos(counts: dict[tuple[int, ...], int], eos_ids: frozenset[int]) -> dict[tuple[int, ...], int]:
    """Drop prefixes that go on past an EOS token (the rest stays closed under taking prefixes)."""
    if not eos_ids:
        return counts
    return {prefix: c for prefix, c in counts.items() if not eos_ids.intersection(prefix[:-1])}
