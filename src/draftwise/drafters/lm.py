"""A Hugging Face causal LM as drafter, with its own KV cache (caught up only on unseen tokens)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from draftwise.drafters.base import Draft, DraftContext, ModelDrafter
from draftwise.drafters.draft_shapes import TreeOptions, draft_chain, draft_tree
from draftwise.drafters.stopping import StopRule
from draftwise.models.cached_lm import CachedLM, TokenCache
from draftwise.models.drafter_bank import BankLM


class LMDrafter(ModelDrafter):
    """Drafts autoregressively with a small causal LM that shares the target's vocabulary."""

    reads_prompt_tail = True

    def __init__(self, model: Any, *, name: str, source: str = "", tree: TreeOptions | None = None,
                 domains: tuple[str, ...] = ()) -> None:
        self.name = name
        self.source = source
        self.domains = domains
        self.model = model
        self.lm: TokenCache = CachedLM(model)  # or, on a bank, a BankLM view (draftwise.models.drafter_bank)
        self.tree = tree or TreeOptions()

    def recover(self) -> None:
        self.lm.reset()  # the next proposal prefills afresh

    def fresh(self) -> LMDrafter:
        return LMDrafter(self.model, name=self.name, source=self.source, tree=self.tree, domains=self.domains)

    def hf_model(self) -> Any | None:
        return self.model

    def join_bank(self, bank: Any, slot: int) -> None:
        self.lm = BankLM(bank, slot, self.model)
        self.bank, self.bank_slot = bank, slot

    @torch.inference_mode()
    def propose(self, context: Sequence[int], max_len: int, ctx: DraftContext, stop: StopRule | None = None) -> Draft:
        if max_len <= 0:
            return Draft([])
        logits = self.lm.logits(context, 1)[0]  # catch-up: prefill only what this drafter has not seen
        if self.tree.kind != "chain":  # stopping rules judge chains; a tree's shape is its own rule
            return draft_tree(self.tree, logits, self.lm.tree_extend, max_len, ctx)
        return draft_chain(logits, lambda token: self.lm.extend([token], 1)[0], max_len, ctx, stop)

    def next_logits(self, context: Sequence[int], n_out: int) -> torch.Tensor:
        return self.lm.logits(context, n_out)

    def describe(self) -> dict[str, Any]:
        tree = {} if self.tree.kind == "chain" else {"tree": self.tree.__dict__}
        params = sum(p.numel() for p in self.model.parameters())
        return {**super().describe(), **tree, "model": self.source, "params": params}
