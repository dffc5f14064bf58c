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
from draftwise.training.heads import HiddenSet, batch_noise, eagle_loss, eagle_unrolled, load_hidden, save_hidden
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


# -- EAGLE-3-style: the bulk signal, several layers fused, several draft steps trained -----------------------
@dataclass(frozen=True)
class SignalHeadRecipe:
    """A head trained on the bulk signal (:mod:`draftwise.training.signal`): it fuses ``feature_layers``
    and is trained over ``unroll`` draft steps on its own predictions (EAGLE-3's training-time test)."""

    feature_layers: tuple[int, ...] = (3, 15, 27, -1)
    intermediate: int = 768
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        steps=3000, batch=8, seq_len=128, lr=2e-3, warmup=100, weight_decay=0.0))
    ce_weight: float = 0.1
    unroll: int = 4
    feature_noise: float = 0.05
    seed: int = 20261128


def signal_head_batch(rows: Any, index: np.ndarray, vocab: VocabMap, layers: int) -> tuple[HiddenSet, torch.Tensor]:
    """(the loss's set: tokens, final hidden states, the target's top-k in the subset, −1 where not learned;
    the fused layers (B, T, L × H))."""
    batch = rows.batch(index)
    ids = vocab.draft_targets(batch.top_ids).masked_fill(~batch.learn[..., None], -1)
    data = HiddenSet(batch.tokens, batch.features[:, :, -1], ids, batch.top_logprobs)
    return data, batch.features[:, :, :layers].flatten(2)


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


@torch.no_grad()
def chain_acceptance(head: EagleHead, data: HiddenSet, inputs: torch.Tensor | None, embed_weight: torch.Tensor,
                     lm_weight: torch.Tensor, steps: int) -> tuple[float, float]:
    """(tokens per target forward, first drafted token accepted) of greedy chains of ``steps`` drafted
    tokens at every position of target-written text (the target's greedy answers, where its top
    choice is the next token): what drafting there would give, computed as training unrolls it.
    ``data.top_ids`` are in the head's vocabulary (−1 off it, or where not scored)."""
    features = (data.hidden if inputs is None else inputs)[:, :-1]
    predicted = eagle_unrolled(head, features, data.tokens, embed_weight, steps)
    chains = data.tokens.shape[1] - steps
    alive = torch.ones(data.tokens.shape[0], chains, dtype=torch.bool)
    accepted = torch.zeros(alive.shape)
    first = torch.zeros(alive.shape, dtype=torch.bool)
    for s, out in enumerate(predicted, start=1):
        guess = (out[:, :chains] @ lm_weight.T).argmax(-1)
        truth = data.top_ids[:, s : s + chains, 0]
        alive &= (guess == truth) & (truth >= 0)
        accepted += alive
        if s == 1:
            first = alive.clone()
    scored = data.top_ids[:, 1 : 1 + chains, 0] >= 0
    return float(1 + accepted[scored].mean()), float(first[scored].float().mean())
