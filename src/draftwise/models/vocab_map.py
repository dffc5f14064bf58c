"""A drafter that speaks a subset of the target's vocabulary (FR-Spec, arXiv 2502.14856).

A small drafter for a target with a large vocabulary spends most of each drafted token in its LM
head (49,152 rows for SmolLM2 against a 256-wide body). Keeping only the tokens the target
actually writes most often — a few thousand cover nearly all of its answers — cuts that cost
several-fold and never touches losslessness: the target verifies every token, and a token the
drafter cannot propose only shortens a draft.

The drafter is an ordinary checkpoint over its own ``K + 1`` ids: ``0..K-1`` stand for the target
tokens ``target_ids``, and ``K`` for every other target token (inputs only). Its folder holds
``draft_vocab.json``; the engine maps context ids into the drafter's ids and scatters its logits
back to the target's vocabulary (every other token at −∞), so the rest of the engine sees a
drafter over the target's vocabulary.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from draftwise.errors import DraftwiseError

FILE = "draft_vocab.json"
ATTRIBUTE = "draftwise_vocab_map"  # set on a loaded drafter model


class VocabMap:
    """Target ids ↔ a drafter's ids; the drafter's last id stands for every unlisted target token."""

    def __init__(self, target_ids: Sequence[int], target_size: int) -> None:
        ids = [int(i) for i in target_ids]
        if len(set(ids)) != len(ids) or not ids or min(ids) < 0 or max(ids) >= target_size:
            raise DraftwiseError(f"{FILE}: target_ids must be distinct ids in [0, {target_size})")
        self.target_size = target_size
        self.other = len(ids)  # the drafter id of every target token it does not list
        self.to_target = torch.tensor(ids, dtype=torch.long)  # (K,)
        to_draft = torch.full((target_size,), self.other, dtype=torch.long)
        to_draft[self.to_target] = torch.arange(len(ids))
        self.to_draft = to_draft  # (V,)
        self.key = hashlib.sha256(json.dumps([target_size, ids]).encode()).hexdigest()[:16]

    @property
    def draft_size(self) -> int:
        return self.other + 1

    def draft_ids(self, ids: Sequence[int], device: Any = None) -> torch.Tensor:
        """(T,) the drafter's ids of target ids."""
        mapped = self.to_draft[torch.as_tensor(list(ids), dtype=torch.long)]
        return mapped if device is None else mapped.to(device)

    def draft_targets(self, targets: torch.Tensor) -> torch.Tensor:
        """Target ids as the drafter's ids, −1 where the drafter cannot propose them."""
        mapped = self.to_draft.to(targets.device)[targets.long()]
        return torch.where(mapped == self.other, torch.full_like(mapped, -1), mapped)

    def target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """(…, K + 1) drafter logits → (…, V) over the target's vocabulary, −∞ off the subset."""
        full = torch.full((*logits.shape[:-1], self.target_size), float("-inf"), dtype=logits.dtype,
                          device=logits.device)
        full[..., self.to_target.to(logits.device)] = logits[..., : self.other]
        return full

    def to_json(self) -> str:
        return json.dumps({"target_vocab_size": self.target_size, "target_ids": self.to_target.tolist()})


def load_vocab_map(folder: str | Path) -> VocabMap | None:
    """The folder's ``draft_vocab.json`` as a map, or None when the drafter uses the whole vocabulary."""
    path = Path(folder) / FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        return VocabMap(record["target_ids"], int(record["target_vocab_size"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise DraftwiseError(f"{path}: not a valid drafter vocabulary ({exc})") from None


def input_ids(vocab: VocabMap | None, ids: Sequence[int], device: Any) -> torch.Tensor:
    """(T,) the ids a model reads: the drafter's own through its map, else the target's as they are."""
    if vocab is None:
        return torch.tensor(list(ids), dtype=torch.long, device=device)
    return vocab.draft_ids(ids, device)


def vocab_map_of(model: Any) -> VocabMap | None:
    return getattr(model, ATTRIBUTE, None)


def attach_vocab_map(model: Any, vocab: VocabMap | None) -> None:
    """Mark a loaded drafter as speaking ``vocab`` (checked against its own vocabulary size)."""
    if vocab is None:
        return
    size = int(model.get_output_embeddings().weight.shape[0])
    if size != vocab.draft_size:
        raise DraftwiseError(f"{FILE} lists {vocab.draft_size - 1} tokens (+1 for the rest) but the drafter "
                             f"has {size} outputs")
    setattr(model, ATTRIBUTE, vocab)


def output_size(model: Any) -> int:
    """The vocabulary a drafter's logits cover, as the engine sees them (the target's, when mapped)."""
    vocab = vocab_map_of(model)
    return vocab.target_size if vocab is not None else int(model.get_output_embeddings().weight.shape[0])
