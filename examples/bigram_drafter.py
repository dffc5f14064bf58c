"""A new drafter kind in one file, outside the package: a bigram model of the text so far.

Its next-token distribution after token ``t`` is the add-``alpha`` frequency of what followed ``t``
earlier in the context. Being a :class:`~draftwise.drafters.ModelDrafter` (it has a distribution),
the engine can route to it, judge its chains with stopping rules and score it in the evaluation
phase — all through the drafter contract. Register it, then name it in a drafter spec::

    import bigram_drafter  # registers "bigram"
    gen = Generator.from_pretrained("zoo:target", drafters=["bigram:vocab=8192", "pld"], policy="hedgespec")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from draftwise.drafters import DRAFTERS, Draft, DraftContext, ModelDrafter, TreeOptions, draft_chain


@DRAFTERS.register("bigram")
class BigramDrafter(ModelDrafter):
    """Proposes what most often followed the last token in this query's text."""

    def __init__(self, *, vocab: int = 0, alpha: float = 0.1, name: str = "bigram") -> None:
        if vocab < 1 or alpha <= 0:
            raise ValueError(
                f"bigram: needs vocab ≥ 1 (the target's vocabulary size) and alpha > 0, got {vocab}, {alpha}")
        self.name, self.vocab, self.alpha = name, vocab, alpha
        self.tree = TreeOptions()  # chains only

    def next_logits(self, context: Sequence[int], n_out: int) -> torch.Tensor:
        """(n_out, V) log-frequencies of the successors of each of the last ``n_out`` tokens."""
        counts = torch.full((n_out, self.vocab), self.alpha)
        first = len(context) - n_out
        for row, position in enumerate(range(first, len(context))):
            token = context[position]
            for i in range(position):  # pairs seen up to this position only
                if context[i] == token:
                    counts[row, context[i + 1]] += 1.0
        return counts.log()

    def propose(self, context: Sequence[int], max_len: int, ctx: DraftContext, stop: Any = None) -> Draft:
        if max_len <= 0 or not context:
            return Draft([])
        tokens = list(context)

        def advance(token: int) -> torch.Tensor:  # the drafted token becomes context for the next one
            tokens.append(token)
            return self.next_logits(tokens, 1)[0]

        return draft_chain(self.next_logits(tokens, 1)[0], advance, max_len, ctx, stop)
