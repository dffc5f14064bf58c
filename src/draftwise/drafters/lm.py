"""A Hugging Face causal LM as drafter, with its own KV cache (caught up only on unseen tokens)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from draftwise.drafters.base import Draft, DraftContext, Drafter
from draftwise.drafters.stopping import StopRule
from draftwise.models import CachedLM
from draftwise.verify import warp


class LMDrafter(Drafter):
    """Drafts autoregressively with a small causal LM that shares the target's vocabulary."""

    point_mass = False

    def __init__(self, model: Any, *, name: str, source: str = "") -> None:
        self.name = name
        self.source = source
        self.lm: Any = CachedLM(model)  # or a view into a LlamaBank (draftwise.fastlm)
        self.bank: Any = None

    def begin_query(self, prompt: Sequence[int]) -> None:
        pass  # the cache follows the context: a new prompt shares no prefix and is prefilled

    @torch.inference_mode()
    def propose(self, context: Sequence[int], max_len: int, ctx: DraftContext, stop: StopRule | None = None) -> Draft:
        if max_len <= 0:
            return Draft([])
        logits = self.lm.logits(context, 1)[0]  # catch-up: prefill only what this drafter has not seen
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        if stop is not None:
            stop.start_draft()
        for step in range(max_len):
            if stop is not None and stop.should_stop(torch.softmax(logits, -1), step) and step > 0:
                break
            if ctx.sampling.greedy:
                token = int(logits.argmax())
            else:
                probs = warp(logits[None], ctx.sampling)[0]
                token = int(torch.multinomial(probs, 1, generator=ctx.generator))
                rows.append(probs)
            tokens.append(token)
            if token in ctx.eos_ids or step == max_len - 1:
                break
            logits = self.lm.extend([token], 1)[0]
        return Draft(tokens, torch.stack(rows) if rows else None)

    def next_logits(self, context: Sequence[int], n_out: int) -> torch.Tensor:
        """Logits after each of the last ``n_out`` positions of ``context`` (the evaluation phase)."""
        return self.lm.logits(context, n_out)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "model": self.source, "params": sum(p.numel() for p in self.lm.model.parameters())}
