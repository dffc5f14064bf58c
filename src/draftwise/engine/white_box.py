"""White-box plumbing: the target's hidden states, handed to the drafters that read them.

They come from the verification forwards (no extra target computation), except for the prompt:
it runs through the target before round 1, so white-box drafters can draft (and be scored) from
round 1 on.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from draftwise.drafters import Drafter
from draftwise.engine.query import QueryState
from draftwise.models.cached_lm import CachedLM


class HiddenStateFeed:
    """Hands the white-box drafters of a pool the target's hidden states as positions are verified."""

    def __init__(self, target: CachedLM, drafters: Sequence[Drafter]) -> None:
        self.target = target
        self.readers = [d for d in drafters if d.reads_target_hidden]
        # every layer some reader reads, recorded once side by side; each reader gets its own columns
        target.hidden_layers = tuple(dict.fromkeys(layer for d in self.readers for layer in d.feature_layers))
        self.columns = [reader_columns(target.hidden_layers, d.feature_layers) for d in self.readers]

    def prefill(self, query: QueryState) -> float:
        """Run the prompt (all but its last token) through the target before round 1. Round 1 then
        feeds only the last prompt token and the draft, so every prompt token is still computed
        once — in two target calls instead of one. Returns the seconds spent."""
        query.hidden_sent = 0
        if not self.readers:
            return 0.0
        start = time.perf_counter()
        if len(query.context) > 1:
            self.target.logits(query.context[:-1], 1)
        self.share(query)
        return time.perf_counter() - start

    def extra_target_calls(self, prompt_len: int) -> int:
        """The prompt prefill is a target call of its own."""
        return 1 if self.readers and prompt_len > 1 else 0

    def share(self, query: QueryState) -> None:
        """Hand over the hidden states of the newly verified positions: every position but the last
        (the target's own token, read next round); a tree's accepted path is gathered first."""
        if not self.readers:
            return
        context = query.context
        known = len(context) - 1
        start = min(query.hidden_sent, known)  # a stop string may have cut the context back
        rows = self.target.hidden_states(context, start, known)
        layers = (len(self.target.hidden_layers), -1)  # a row's recorded layers, side by side
        for drafter, columns in zip(self.readers, self.columns):
            mine = rows if columns is None else rows.unflatten(-1, layers)[:, columns].flatten(1)
            drafter.observe_target(context, mine, start)
        query.hidden_sent = known


def reader_columns(recorded: tuple[int, ...], wanted: tuple[int, ...]) -> torch.Tensor | None:
    """Which of the ``recorded`` layers (side by side in a row) are the ``wanted`` ones (None: all, as they are)."""
    if recorded == wanted:
        return None
    return torch.tensor([recorded.index(layer) for layer in wanted])
