"""Prompt lookup decoding (PLD): propose what followed the last n-gram the last time it occurred."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from draftwise.drafters.base import DRAFTERS, Draft, DraftContext, Drafter
from draftwise.errors import DraftwiseError


class NgramIndex:
    """For each n ≤ max_ngram, the latest position where each n-gram ended (incremental).

    Only n-grams ending strictly before the last token are indexed, so a lookup of the current
    suffix finds its latest *earlier* occurrence, which has a continuation.

    >>> index = NgramIndex(max_ngram=2)
    >>> index.lookup([5, 6, 7, 5, 6])  # "5 6" occurred before, followed by 7, 5, 6
    2
    """

    def __init__(self, max_ngram: int) -> None:
        self.max_ngram = max_ngram
        self.reset()

    def reset(self) -> None:
        self.tables: list[dict[tuple[int, ...], int]] = [{} for _ in range(self.max_ngram + 1)]
        self.indexed = 0  # n-grams ending at positions < indexed are in the tables
        self.anchor: list[int] = []  # the first tokens of the sequence we index (to detect a new one)

    def _sync(self, tokens: Sequence[int]) -> None:
        if len(tokens) < self.indexed or list(tokens[: len(self.anchor)]) != self.anchor:
            self.reset()
        if not self.anchor:
            self.anchor = list(tokens[:16])
        for end in range(max(self.indexed, 1), len(tokens)):
            for n in range(1, min(self.max_ngram, end) + 1):
                self.tables[n][tuple(tokens[end - n : end])] = end
        self.indexed = max(self.indexed, len(tokens))

    def lookup(self, tokens: Sequence[int], min_ngram: int = 1) -> int | None:
        """Start of the continuation of the longest matching suffix n-gram (at least ``min_ngram``), or None."""
        found = self.match(tokens, min_ngram)
        return None if found is None else found[0]

    def match(self, tokens: Sequence[int], min_ngram: int = 1) -> tuple[int, int] | None:
        """:meth:`lookup`'s start and the length of the n-gram matched, or None."""
        self._sync(tokens)
        for n in range(min(self.max_ngram, len(tokens)), min_ngram - 1, -1):
            start = self.tables[n].get(tuple(tokens[-n:]))
            if start is not None:
                return start, n
        return None


# Single-token matches are not proposed by default: on the zoo dev set a 1-gram match predicts the
# next tokens poorly, and skipping it made PLD alone ≈ 2 % faster and the default policy (which
# plays a model drafter when PLD has nothing) ≈ 8 % faster (`benchmarks/policy_ab.py`, 2026-11-21;
# docs/design.md, "Drafters").
# ``min_ngram=1`` restores the original method (Saxena 2023).
MIN_NGRAM = 2


@DRAFTERS.register("pld")
class PromptLookupDrafter(Drafter):
    """Longest n-gram match (max_ngram down to min_ngram) of the last tokens within prompt + generated text."""

    def __init__(self, *, max_ngram: int = 3, min_ngram: int | None = None, name: str = "pld") -> None:
        if max_ngram < 1:
            raise DraftwiseError(f"pld: max_ngram must be ≥ 1, got {max_ngram}")
        min_ngram = min(MIN_NGRAM, max_ngram) if min_ngram is None else min_ngram
        if not 1 <= min_ngram <= max_ngram:
            raise DraftwiseError(f"pld: min_ngram must be between 1 and max_ngram ({max_ngram}), got {min_ngram}")
        self.name = name
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.index = NgramIndex(max_ngram)

    def begin_query(self, prompt: Sequence[int]) -> None:
        self.index.reset()

    def recover(self) -> None:
        self.index.reset()

    def propose(self, context: Sequence[int], max_len: int, ctx: DraftContext, stop: Any = None) -> Draft:
        found = self.index.match(context, self.min_ngram) if max_len > 0 else None
        if found is None:
            return Draft([])
        start, matched = found
        return Draft(_cut_at_eos(list(context[start : start + max_len]), ctx.eos_ids), match=matched)

    def first_tokens_along(self, context: Sequence[int], verified: Sequence[int],
                           ctx: DraftContext) -> list[int | None]:
        """``propose(…, 1)`` at each verified position, without building drafts."""
        sequence = list(context)
        out: list[int | None] = []
        for token in verified:
            start = self.index.lookup(sequence, self.min_ngram)
            out.append(None if start is None else sequence[start])
            sequence.append(token)
        return out

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "max_ngram": self.max_ngram, "min_ngram": self.min_ngram}


def _cut_at_eos(tokens: list[int], eos_ids: frozenset[int]) -> list[int]:
    """Drafting past an end-of-sequence token is wasted work: keep tokens up to the first EOS."""
    for i, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[: i + 1]
    return tokens
