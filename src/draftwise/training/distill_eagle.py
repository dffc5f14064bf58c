"""An EAGLE-3-style head for a real target, trained on the bulk signal (:mod:`draftwise.training.signal`).

The head drafts over the same vocabulary subset as the distilled LM drafters (``draft_vocab.json``
beside its weights): its own layer costs a fraction of a millisecond, and the target's LM head
restricted to the subset's rows stays about as cheap, where the whole 49k-row head would cost more
than both (:class:`~draftwise.drafters.whitebox.WhiteBoxDrafter`).

As EAGLE-3 (Li et al. 2025) it reads the target's low, middle and high layers with the final one,
fused by a linear layer, and is trained with training-time test: ``unroll`` draft steps, each on
the head's own previous prediction, scored against the target at every step. The loss is EAGLE's:
smooth-L1 to the target's next final hidden state plus ``ce_weight`` × cross-entropy against its
next-token distribution (top-k, over the subset) through the frozen LM head; inputs carry a little
noise. Rows are windows of packed sequences (EAGLE trains on packed conversations); each
sequence's features come from the target reading it alone.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from draftwise.drafters.eagle import EagleHead, eagle_config
from draftwise.drafters.whitebox import WEIGHTS_FILE, lm_head_fingerprint, save_head, target_dims
from draftwise.errors import DraftwiseError
from draftwise.models.loading import resolve_model_path
from draftwise.models.vocab_map import FILE as VOCAB_FILE
from draftwise.models.vocab_map import VocabMap
from draftwise.training.heads import HiddenSet, batch_noise, eagle_loss
from draftwise.training.train import TrainConfig, train_loop

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SignalHeadRecipe:
    """A head trained on the bulk signal (:mod:`draftwise.training.signal`): it fuses ``feature_layers``
    and is trained over ``unroll`` draft steps on its own predictions (EAGLE-3's training-time test)."""

    feature_layers: tuple[int, ...] = (3, 15, 27, -1)
    intermediate: int = 768
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        steps=1200, batch=8, seq_len=128, lr=1e-3, warmup=50, weight_decay=0.0, snapshot_every=200))
    ce_weight: float = 0.1
    unroll: int = 4
    feature_noise: float = 0.05
    seed: int = 20261128
    start: str = ""  # a trained head (folder or zoo name) to start from: see :func:`start_from`
    sources: tuple[str, ...] = ("answers",)  # which of the signal's sources it learns from


def signal_head_batch(rows: Any, index: np.ndarray, vocab: VocabMap, layers: int) -> tuple[HiddenSet, torch.Tensor]:
    """(the loss's set: tokens, final hidden states, the target's top-k in the subset, −1 where not learned;
    the fused layers (B, T, L × H))."""
    batch = rows.batch(index)
    ids = vocab.draft_targets(batch.top_ids).masked_fill(~batch.learn[..., None], -1)
    data = HiddenSet(batch.tokens, batch.features[:, :, -1], ids, batch.top_logprobs)
    return data, batch.features[:, :, :layers].flatten(2)


def start_from(head: EagleHead, folder: Path) -> None:
    """Start ``head`` from a trained head of the same shape: its weights. A fused ``head`` started from
    one that reads the final layer only gets a fusion that passes the final layer through (the same
    drafts as that head until training moves it); started from a fused head, it keeps that fusion."""
    state = {k: v.float() for k, v in load_file(str(folder / WEIGHTS_FILE)).items()}
    try:
        missing, unexpected = head.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a weight of another size
        raise DraftwiseError(f"{folder}: not a head of this shape to start from ({exc})") from None
    if unexpected or set(missing) - {"fuse.weight"}:
        raise DraftwiseError(f"{folder}: not a head of this shape to start from ({missing + unexpected})")
    if head.fuse is not None and "fuse.weight" in missing:
        size, final = head.config.hidden_size, head.config.feature_layers.index(-1)
        with torch.no_grad():
            head.fuse.weight.zero_()
            head.fuse.weight[:, final * size : (final + 1) * size] = torch.eye(size)


def train_signal_head(target: Any, target_name: str, rows: Any, vocab: VocabMap, work: Path, folder: Path,
                      recipe: SignalHeadRecipe, domains: tuple[str, ...]) -> Path:
    """Train (resuming from ``work``'s checkpoint) and save the head in ``folder``. ``rows``: a
    :class:`~draftwise.training.signal_rows.SignalRows` carrying ``feature_layers`` then the final layer."""
    hidden_size, vocab_size = target_dims(target)
    config = eagle_config(hidden_size, vocab_size, intermediate_size=recipe.intermediate, target=target_name,
                          target_fingerprint=lm_head_fingerprint(target), domains=domains,
                          rms_norm_eps=float(getattr(target.config, "rms_norm_eps", 1e-6)),
                          feature_layers=recipe.feature_layers)
    torch.manual_seed(recipe.seed)
    head = EagleHead(config)
    if recipe.start:
        start_from(head, Path(resolve_model_path(recipe.start)))
    embed = target.get_input_embeddings().weight.detach().float()
    lm = target.get_output_embeddings().weight.detach().float()[vocab.to_target]
    layers = len(recipe.feature_layers)

    def loss_of_rows(model: Any, index: np.ndarray) -> torch.Tensor:
        data, inputs = signal_head_batch(rows, index, vocab, layers)
        return eagle_loss(model, embed, lm, data, recipe.ce_weight, recipe.feature_noise,
                          batch_noise(recipe.seed, index), recipe.unroll, inputs if layers > 1 else None)

    work.mkdir(parents=True, exist_ok=True)
    state = train_loop(head, len(rows), loss_of_rows, recipe.train, recipe.seed + 1, work / "head.ckpt", "eagle3",
                       False)
    save_head(head, config, folder)
    (folder / VOCAB_FILE).write_text(vocab.to_json() + "\n")
    meta = {"kind": "eagle", "domains": list(domains), "params": sum(p.numel() for p in head.parameters()),
            "train_tokens": rows.tokens(), "recipe": asdict(recipe), **asdict(state)}
    (folder / "training.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return folder
