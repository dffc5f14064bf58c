"""EAGLE-style drafter: one decoder layer that extrapolates the target's hidden state.

Input at pair i is the target's final hidden state h_i (after token x_i) and the embedding of the
next token x_{i+1}, concatenated and projected (``fc``); one Llama-style decoder layer (its own
small KV cache) outputs ĥ_{i+1}, an estimate of the target's next hidden state, and the target's
own LM head turns it into the distribution of x_{i+2}. Drafting continues on the head's own
predictions: pair (ĥ_{t+1}, x̂_{t+2}) gives ĥ_{t+2}, and so on (EAGLE-1, Li et al. 2024).

A head may read several of the target's layers (``feature_layers``, EAGLE-3's low, middle and
high ones with the final one): a linear ``fuse`` turns them into one feature for the pairs built
from the target; the pairs built from the head's own predictions take its output as it is.

Cache rule: pairs built from the target's hidden states are kept across rounds (the verified
context); pairs built from the head's own predictions (draft steps, tree nodes) are cut back at
the next sync, because the verified tokens get their true hidden states from the target.
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
from draftwise.drafters.whitebox import (
    HeadConfig,
    RMSNorm,
    RowBuffer,
    WhiteBoxDrafter,
    apply_rotary,
    causal_allowed,
    load_head_weights,
    register_head_kind,
    rotary_tables,
)
from draftwise.models.cached_lm import common_prefix_len
from draftwise.models.vocab_map import VocabMap
from draftwise.verify.tree import ROOT, tree_attention_mask, tree_positions

KV = tuple[torch.Tensor, torch.Tensor]


def eagle_config(hidden_size: int, vocab_size: int, *, intermediate_size: int = 0, num_attention_heads: int = 0,
                 num_key_value_heads: int = 0, **extra: Any) -> HeadConfig:
    """An EAGLE head's config; widths default to a lean layer (MLP 4/3 × hidden, 2 key/value heads)."""
    heads = num_attention_heads or max(1, hidden_size // 64)
    kv = num_key_value_heads or (2 if heads % 2 == 0 else 1)
    mlp = intermediate_size or round(hidden_size * 4 / 3 / 64) * 64 or hidden_size
    return HeadConfig("eagle", hidden_size, vocab_size, intermediate_size=mlp, num_attention_heads=heads,
                      num_key_value_heads=kv, **extra)


class EagleHead(nn.Module):
    """fc over [embedding; hidden] → one pre-norm decoder layer (rotary GQA attention, SwiGLU MLP)."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        h, heads, kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        if heads < 1 or kv < 1 or h % heads or heads % kv:
            raise ValueError(f"eagle head: hidden {h} must split into {heads} heads, a multiple of {kv} kv heads")
        self.config = config
        self.head_dim = h // heads
        layers = len(config.feature_layers)
        self.fuse = nn.Linear(layers * h, h, bias=False) if layers > 1 else None
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.attn_norm = RMSNorm(h, config.rms_norm_eps)
        self.q_proj = nn.Linear(h, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, h, bias=False)
        self.mlp_norm = RMSNorm(h, config.rms_norm_eps)
        self.gate_proj = nn.Linear(h, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, h, bias=False)

    def forward(self, features: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor,
                past: KV | None = None, allowed: torch.Tensor | None = None) -> tuple[torch.Tensor, KV]:
        """Predicted next hidden states (B, T, H) and the new pairs' keys and values (B, kv, T, d).

        ``features`` (B, T, H), or the target's layers side by side (B, T, L × H) to fuse; ``embeds``
        (B, T, H), ``positions`` (B, T); ``past`` keys and values (B, kv, P, d) already rotated;
        ``allowed`` (T, P + T) bool, default causal after the past.
        """
        c = self.config
        b, t, width = features.shape
        if self.fuse is not None and width != c.hidden_size:
            features = self.fuse(features)
        x = self.fc(torch.cat([embeds, features], -1))
        n = self.attn_norm(x)
        q = self.q_proj(n).view(b, t, c.num_attention_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(n).view(b, t, c.num_key_value_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(n).view(b, t, c.num_key_value_heads, self.head_dim).transpose(1, 2)
        cos, sin = rotary_tables(positions, self.head_dim, c.rope_theta)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        keys, values = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        if allowed is None and t > 1:  # a single new query sees everything: no mask
            allowed = causal_allowed(keys.shape[2] - t, t, x.device)
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed,
                                              enable_gqa=c.num_key_value_heads < c.num_attention_heads)
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, t, -1))
        n = self.mlp_norm(x)
        x = x + self.down_proj(F.silu(self.gate_proj(n)) * self.up_proj(n))
        return x, (k, v)


class EagleDrafter(WhiteBoxDrafter):
    """Drafts a chain or a tree with an :class:`EagleHead` on the target's hidden states."""

    def __init__(self, head: EagleHead, target: Any, *, name: str, source: str = "",
                 tree: TreeOptions | None = None, vocab: VocabMap | None = None) -> None:
        super().__init__(target, head.config, name=name, source=source, tree=tree, vocab=vocab)
        self.head = head.eval()
        self.keys, self.values = RowBuffer(), RowBuffer()  # (rows, kv, d): context pairs, then draft pairs
        self.pair_tokens: list[int] = []  # x_{i+1} of each context pair i in the cache
        self.pairs = 0  # context pairs still valid in the cache

    def head_module(self) -> torch.nn.Module:
        return self.head

    def _invalidate(self, start: int) -> None:
        self.pairs = min(self.pairs, start)  # pair i reads h_i

    def _truncate(self, length: int) -> None:
        self.keys.truncate(length)
        self.values.truncate(length)

    def _feed(self, features: torch.Tensor, tokens: Sequence[int], positions: Sequence[int],
              allowed: torch.Tensor | None) -> torch.Tensor:
        """Run pairs (features (n, H), tokens) after the cache; append their keys and values; outputs (n, H)."""
        device = features.device
        embeds = self.embed(torch.tensor([list(tokens)], dtype=torch.long, device=device))
        past = None
        if self.keys.length:
            past = (self.keys.view().permute(1, 0, 2)[None], self.values.view().permute(1, 0, 2)[None])
        dtype = self.head.fc.weight.dtype  # the target's features and embedding may come in another dtype
        out, (k, v) = self.head(features[None].to(dtype), embeds.to(dtype),
                                torch.tensor([list(positions)], device=device), past, allowed)
        self.keys.append(k[0].transpose(0, 1))
        self.values.append(v[0].transpose(0, 1))
        return out[0]

    def _sync(self, context: Sequence[int], n_out: int) -> torch.Tensor:
        """Bring the cache to the context's pairs; the head's outputs at (at least) the last ``n_out`` pairs.

        Pair i = (h_i, x_{i+1}) for every i < len(context) − 1; the output at the last pair predicts
        the target's state after the context's last token, hence the first draft token.
        """
        needed = len(context) - 1
        hidden = self.hidden_for(context, 0, needed)
        keep = min(common_prefix_len(self.pair_tokens[: self.pairs], context[1 : needed + 1]), max(needed - n_out, 0))
        self._truncate(keep)
        out = self._feed(hidden[keep:needed], context[keep + 1 : needed + 1], range(keep, needed), None)
        self.pairs, self.pair_tokens = needed, list(context[1 : needed + 1])
        return out

    @torch.inference_mode()
    def next_logits(self, context: Sequence[int], n_out: int) -> torch.Tensor:
        if len(context) < 2:
            return torch.zeros(n_out, self.vocab_size, device=self.lm_head.weight.device)
        return self.padded(self.head_logits(self._sync(context, n_out)), n_out)

    @torch.inference_mode()
    def propose(self, context: Sequence[int], max_len: int, ctx: DraftContext, stop: StopRule | None = None) -> Draft:
        if max_len <= 0 or len(context) < 2:
            return Draft([])
        feature = self._sync(context, 1)[-1]
        logits = self.head_logits(feature)
        if self.tree.kind != "chain":
            return draft_tree(self.tree, logits, self._tree_expander(feature, len(context) - 1), max_len, ctx)
        return draft_chain(logits, self._chain_advancer(feature, len(context) - 1), max_len, ctx, stop)

    def _chain_advancer(self, feature: torch.Tensor, position: int):
        """``advance(token)`` for :func:`draft_chain`: the pair (last predicted feature, drafted token),
        the first one right after the context pairs."""
        last = [feature]  # the latest predicted feature and its position, advanced per drafted token
        at = [position]

        def advance(token: int) -> torch.Tensor:
            last[0] = self._feed(last[0][None], [token], [at[0]], None)[0]
            at[0] += 1
            return self.head_logits(last[0])

        return advance

    def _tree_expander(self, root_feature: torch.Tensor, context_pairs: int):
        """``expand(tokens, parents)`` for :func:`draft_tree`: a node's pair is (its parent's output, its token)."""
        outputs: list[torch.Tensor] = []
        parents_so_far: list[int] = []

        def expand(tokens: list[int], parents: list[int]) -> torch.Tensor:
            features = torch.stack([root_feature if p == ROOT else outputs[p] for p in parents])
            new_from = len(parents_so_far)
            parents_so_far.extend(parents)
            allowed = tree_attention_mask(parents_so_far, context_pairs, 0, new_from).to(features.device)
            positions = tree_positions(parents_so_far, context_pairs)[new_from:]
            out = self._feed(features, tokens, positions, allowed)
            outputs.extend(out)
            return self.head_logits(out)

        return expand


@register_head_kind("eagle")
def load_eagle(folder: Path, config: HeadConfig, target: Any, name: str, source: str,
               tree: TreeOptions | None, vocab: VocabMap | None) -> EagleDrafter:
    head = EagleHead(config)
    load_head_weights(head, folder)
    return EagleDrafter(head, target, name=name, source=source, tree=tree, vocab=vocab)
