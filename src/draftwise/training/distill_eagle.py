"""An EAGLE head for a real target, trained on the target's own greedy answers (the distill labels).

The head drafts over the same vocabulary subset as the distilled LM drafters (``draft_vocab.json``
beside its weights): its own layer costs a fraction of a millisecond, and the target's LM head
restricted to the subset's rows stays about as cheap, where the whole 49k-row head would cost more
than both (:class:`~draftwise.drafters.whitebox.WhiteBoxDrafter`).

Stages, each resumable:

1. ``eagle/hidden/DOMAIN.npz``: the target reads each labelled example (prompt + its greedy answer)
   on its own; its final hidden states (fp16) and top-k next-token log-probabilities, with the ids
   mapped into the subset (−1 where the drafter cannot propose them), per domain;
2. the head (``models/eagle`` of the distill build): one generalist over every domain, checkpointed
   as it trains.

The examples' rows are then packed into rows of ``seq_len`` for training, as EAGLE trains on packed
conversations; only the hidden states come from each example alone.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from draftwise.drafters.eagle import EagleHead, eagle_config
from draftwise.drafters.whitebox import lm_head_fingerprint, save_head, target_dims
from draftwise.models.vocab_map import FILE as VOCAB_FILE
from draftwise.models.vocab_map import VocabMap
from draftwise.training.heads import HiddenSet, batch_noise, eagle_loss, load_hidden, save_hidden
from draftwise.training.train import TrainConfig, train_loop

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EagleRecipe:
    """What the head is and how it is trained (sized for about half an hour on 2 CPU cores)."""

    examples_per_domain: int = 150  # labelled examples the target reads per domain
    top_k: int = 8  # the target's next-token distribution, kept as its top-k
    intermediate: int = 768  # the decoder layer's MLP width (4/3 × 576)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        steps=1500, batch=8, seq_len=128, lr=2e-3, warmup=100, weight_decay=0.0))
    ce_weight: float = 0.1  # EAGLE's classification weight next to the regression's 1.0
    unroll: int = 2  # draft steps trained (2: also the first on the head's own prediction)
    feature_noise: float = 0.05
    seed: int = 20261127


@torch.inference_mode()
def example_hidden(target: Any, sequences: Sequence[Sequence[int]], vocab: VocabMap, top_k: int) -> HiddenSet:
    """The target on each sequence alone, packed into one row: tokens, hidden states, top-k."""
    tokens, hidden, ids, logprobs = [], [], [], []
    for sequence in sequences:
        out = target(input_ids=torch.tensor([list(sequence)]), output_hidden_states=True)
        top = torch.log_softmax(out.logits[0].float(), -1).topk(top_k, dim=-1)
        tokens.append(torch.tensor(list(sequence)))
        hidden.append(out.hidden_states[-1][0].half())
        ids.append(vocab.draft_targets(top.indices))
        logprobs.append(top.values.half())
    return HiddenSet(torch.cat(tokens)[None], torch.cat(hidden)[None], torch.cat(ids)[None], torch.cat(logprobs)[None])


def packed_rows(data: HiddenSet, seq_len: int) -> HiddenSet:
    """One long row cut into rows of ``seq_len`` (the tail left out)."""
    n = data.tokens.shape[1] // seq_len
    cut = lambda t: t[0, : n * seq_len].reshape(n, seq_len, *t.shape[2:])
    return HiddenSet(cut(data.tokens), cut(data.hidden), cut(data.top_ids), cut(data.top_logprobs))


def collect_stage(target: Any, sequences: dict[str, list[list[int]]], vocab: VocabMap, recipe: EagleRecipe,
                  folder: Path) -> list[Path]:
    """Hidden states per domain, each domain's file written once (an interrupted run resumes)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for domain, rows in sequences.items():
        path = folder / f"{domain}.npz"
        if not path.exists():
            started = time.perf_counter()
            data = example_hidden(target, rows[: recipe.examples_per_domain], vocab, recipe.top_k)
            save_hidden(data, path)
            log.info("eagle hidden %s: %d tokens in %.0fs", domain, data.tokens.numel(), time.perf_counter() - started)
        paths.append(path)
    return paths


def train_eagle(target: Any, target_name: str, sequences: dict[str, list[list[int]]], vocab: VocabMap, work: Path,
                folder: Path, recipe: EagleRecipe | None = None) -> Path:
    """Collect (resuming, under ``work``), train (resuming from its checkpoint) and save the head in ``folder``."""
    recipe = recipe or EagleRecipe()
    paths = collect_stage(target, sequences, vocab, recipe, work / "hidden")
    if (folder / "model.safetensors").exists():
        return folder
    data = packed_rows(load_hidden(paths, axis=1), recipe.train.seq_len)
    hidden_size, vocab_size = target_dims(target)
    config = eagle_config(hidden_size, vocab_size, intermediate_size=recipe.intermediate, target=target_name,
                          target_fingerprint=lm_head_fingerprint(target), domains=tuple(sequences),
                          rms_norm_eps=float(getattr(target.config, "rms_norm_eps", 1e-6)))
    torch.manual_seed(recipe.seed)
    head = EagleHead(config)
    embed = target.get_input_embeddings().weight.detach().float()
    lm = target.get_output_embeddings().weight.detach().float()[vocab.to_target]  # the subset's rows

    def loss_of_rows(model: Any, index: np.ndarray) -> torch.Tensor:
        return eagle_loss(model, embed, lm, data.batch(index), recipe.ce_weight, recipe.feature_noise,
                          batch_noise(recipe.seed, index), recipe.unroll)

    started = time.perf_counter()
    state = train_loop(head, len(data), loss_of_rows, recipe.train, recipe.seed + 1, work / "head.ckpt", "eagle",
                       False)
    save_head(head, config, folder)
    (folder / VOCAB_FILE).write_text(vocab.to_json() + "\n")
    meta = {"kind": "eagle", "domains": list(sequences), "params": sum(p.numel() for p in head.parameters()),
            "train_tokens": int(data.tokens.numel()), "train_seconds": round(time.perf_counter() - started),
            "recipe": asdict(recipe), **asdict(state)}
    (folder / "training.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return folder
