"""Medusa-style heads: k residual blocks on the target's last hidden state, one per token ahead.

At a context ending in x_T (the target's own token, not yet read by the target), the target's last
hidden state h_{T−1} is the one that predicted x_T; head j (1-based) maps it to a guess of
x_{T+j} through the target's LM head: ``lm_head(h + SiLU(W_j h + b_j))`` (Cai et al. 2024). The
heads do not see each other's tokens, so a draft is one forward for all k positions: a chain
(top-1 or a draw per head) or a tree whose nodes at depth j are head j's candidates.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from draftwise.drafters.base import Draft, DraftContext
from draftwise.drafters.draft_shapes import TreeOptions, draft_chain, draft_tree
from draftwise.drafters.stopping import StopRule
from draftwise.drafters.whitebox import HeadConfig, WhiteBoxDrafter, load_head_weights, register_head_kind
from draftwise.models.vocab_map import VocabMap


def medusa_config(hidden_size: int, vocab_size: int, num_heads: int = 3, **extra: Any) -> HeadConfig:
    return HeadConfig("medusa", hidden_size, vocab_size, num_heads=num_heads, **extra)


class MedusaHeads(nn.Module):
    """k residual SiLU blocks; zero-initialised, so an untrained head j repeats the target's next-token guess."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        if config.num_heads < 1:
            raise ValueError("medusa: need at least one head")
        self.config = config
        self.blocks = nn.ModuleList(nn.Linear(config.hidden_size, config.hidden_size) for _ in range(config.num_heads))
        for block in self.blocks:
            assert isinstance(block, nn.Linear)
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(…, H) → (k, …, H): each head's feature for the LM head."""
        return torch.stack([hidden + F.silu(block(hidden)) for block in self.blocks])


class MedusaDrafter(WhiteBoxDrafter):
    """Proposes up to k tokens from the target's last hidden state, in one head forward."""

    def __init__(self, heads: MedusaHeads, target: Any, *, name: str, source: str = "",
                 tree: TreeOptions | None = None, vocab: VocabMap | None = None) -> None:
        super().__init__(target, heads.config, name=name, source=source, tree=tree, vocab=vocab)
        self.heads = heads.eval()

    def head_module(self) -> torch.nn.Module:
        return self.heads

    @torch.inference_mode()
    def next_logits(self, context: Sequence[int], n_out: int) -> torch.Tensor:
        needed = len(context) - 1
        hidden = self.hidden_for(context, max(needed - n_out, 0), needed)
        if not hidden.numel():
            return torch.zeros(n_out, self.vocab_size, device=self.lm_head.weight.device)
        return self.padded(self.head_logits(self._first(hidden)), n_out)

    def _first(self, hidden: torch.Tensor) -> torch.Tensor:
        """Head 1 only: the first draft token is all the evaluation phase and the prompt prior score."""
        return hidden + F.silu(self.heads.blocks[0](hidden))

    @torch.inference_mode()
    def propose(self, context: Sequence[int], max_len: int, ctx: DraftContext, stop: StopRule | None = None) -> Draft:
        if max_len <= 0 or len(context) < 2:
            return Draft([])
        needed = len(context) - 1
        hidden = self.hidden_for(context, needed - 1, needed)[0]
        logits = self.head_logits(self.heads(hidden))  # (k, V): position t+1 … t+k
        max_len = min(max_len, logits.shape[0])
        if self.tree.kind != "chain":
            return draft_tree(self.tree, logits[0], _by_depth(logits), max_len, ctx)
        later = iter(logits[1:])  # the heads ignore the drafted tokens: position j + 1 is head j + 1's
        return draft_chain(logits[0], lambda token: next(later), max_len, ctx, stop)


def _by_depth(logits: torch.Tensor):
    """``expand`` for :func:`draft_tree`: every node at depth d gets head d + 1's logits (the heads ignore the path).

    The tree growers call ``expand`` once per depth, with that depth's frontier.
    """
    depth = [0]

    def expand(tokens: list[int], parents: list[int]) -> torch.Tensor:
        depth[0] += 1
        return logits[depth[0]].expand(len(tokens), -1)

    return expand


@register_head_kind("medusa")
def load_medusa(folder: Path, config: HeadConfig, target: Any, name: str, source: str,
                tree: TreeOptions | None, vocab: VocabMap | None) -> MedusaDrafter:
    heads = MedusaHeads(config)
    load_head_weights(heads, folder)
    return MedusaDrafter(heads, target, name=name, source=source, tree=tree, vocab=vocab)
