"""Training loops for the zoo: next-token training of the target, logit distillation of drafters.

Both loops share one shape: a deterministic batch schedule (a function of seed and step only),
AdamW with warm-up + cosine decay, gradient clipping, and a checkpoint written atomically every
few minutes so an interrupted build resumes where it stopped and ends with the same weights.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import LlamaConfig, LlamaForCausalLM

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    max_positions: int = 1024


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch: int
    seq_len: int
    lr: float
    warmup: int
    weight_decay: float = 0.1
    clip: float = 1.0
    checkpoint_seconds: float = 180.0
    snapshot_every: int = 0  # keep the model's weights every this many steps (a learning curve); 0: never


@dataclass(frozen=True)
class SpecialIds:
    pad: int
    eos: int


def llama_config(shape: ModelShape, vocab_size: int, ids: SpecialIds) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=shape.max_positions,
        rope_theta=10000.0,  # type: ignore[call-arg]  # transformers' stubs omit it; the config takes it
        tie_word_embeddings=True,
        bos_token_id=ids.eos,
        eos_token_id=ids.eos,
        pad_token_id=ids.pad,
        initializer_range=0.02,
    )


def new_model(shape: ModelShape, vocab_size: int, ids: SpecialIds, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)  # the only randomness in a model is its initialisation
    model = LlamaForCausalLM(llama_config(shape, vocab_size, ids))
    model.generation_config.pad_token_id = ids.pad
    return model


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied embeddings are counted once


# ----------------------------------------------------------------------------- data


def chunk_stream(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """Cut a token stream into rows of ``seq_len`` (the ragged tail is dropped). (N, T)"""
    rows = len(stream) // seq_len
    return stream[: rows * seq_len].reshape(rows, seq_len)


def batch_rows(n_rows: int, batch: int, step: int, seed: int) -> np.ndarray:
    """Row indices of batch ``step``: epochs walk a fresh seeded permutation of all rows.

    A pure function of (n_rows, batch, step, seed), which is what makes resuming exact.
    """
    per_epoch = max(n_rows // batch, 1)
    epoch, index = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(n_rows)
    return order[index * batch : (index + 1) * batch]


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(config.steps - config.warmup, 1)
    return config.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))))


# ----------------------------------------------------------------------------- losses


def next_token_loss(model: LlamaForCausalLM, rows: torch.Tensor, pad: int) -> torch.Tensor:
    logits = model(input_ids=rows).logits[:, :-1]  # (B, T-1, V)
    labels = rows[:, 1:].clone()
    labels[labels == pad] = -100
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1), ignore_index=-100)


def distill_loss(
    model: LlamaForCausalLM, rows: torch.Tensor, top_ids: torch.Tensor, top_logprobs: torch.Tensor
) -> torch.Tensor:
    """Soft cross-entropy to the teacher's top-k next-token distribution (renormalised over k).

    rows (B, T); top_ids, top_logprobs (B, T, k): the teacher's k most likely next tokens at
    every position and their log-probabilities.
    """
    student = torch.log_softmax(model(input_ids=rows).logits.float(), dim=-1)  # (B, T, V)
    teacher = torch.softmax(top_logprobs.float(), dim=-1)  # (B, T, k), renormalised
    picked = student.gather(-1, top_ids.long())  # (B, T, k)
    return -(teacher * picked).sum(-1).mean()


# ----------------------------------------------------------------------------- loop with resume


@dataclass
class TrainState:
    step: int = 0
    tokens: int = 0
    seconds: float = 0.0
    last_loss: float = float("nan")


def save_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: TrainState) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "state": asdict(state)}, tmp)
    os.replace(tmp, path)  # atomic: a kill mid-write leaves the previous checkpoint intact


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> TrainState:
    saved = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    return TrainState(**saved["state"])


def snapshot_path(checkpoint: Path, step: int) -> Path:
    """Where :func:`train_loop` keeps the weights at ``step`` (``TrainConfig.snapshot_every``)."""
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    return checkpoint.with_name(f"{checkpoint.stem}-step{step:06d}.pt")


def make_optimizer(model: torch.nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95), eps=1e-8)


LossFn = Callable[[Any, np.ndarray], torch.Tensor]  # (model, batch rows) → loss


def train_loop(
    model: torch.nn.Module,
    n_rows: int,
    loss_of_rows: LossFn,
    config: TrainConfig,
    seed: int,
    checkpoint: Path,
    label: str,
    progress: bool,
) -> TrainState:
    """Run ``config.steps`` optimiser steps, resuming from ``checkpoint`` when it exists.

    ``loss_of_rows(model, row_indices)`` computes the loss of one batch; the caller owns the data.
    Returns the final state (tokens seen, seconds spent training, last smoothed loss).
    """
    optimizer = make_optimizer(model, config)
    state = TrainState()
    if checkpoint.exists():
        state = load_checkpoint(checkpoint, model, optimizer)
        log.info("%s: resuming from step %d (%s)", label, state.step, checkpoint)
    model.train()
    last_save = time.monotonic()
    smoothed = state.last_loss
    bar = tqdm(total=config.steps, initial=state.step, desc=label, disable=not progress, mininterval=5.0)
    while state.step < config.steps:
        started = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(state.step, config)
        rows = batch_rows(n_rows, config.batch, state.step, seed)
        loss = loss_of_rows(model, rows)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
        optimizer.step()
        value = float(loss.detach())
        smoothed = value if math.isnan(smoothed) else 0.98 * smoothed + 0.02 * value
        state = TrainState(
            step=state.step + 1,
            tokens=state.tokens + len(rows) * config.seq_len,
            seconds=state.seconds + time.perf_counter() - started,
            last_loss=smoothed,
        )
        bar.update(1)
        bar.set_postfix(loss=f"{smoothed:.3f}", tok_s=f"{state.tokens / max(state.seconds, 1e-9):.0f}")
        if state.step % 50 == 0:
            log.info(
                "%s: step %d/%d loss %.4f lr %.2e %.0f tok/s",
                label, state.step, config.steps, smoothed, lr_at(state.step, config),
                state.tokens / max(state.seconds, 1e-9),
            )
        if config.snapshot_every and state.step % config.snapshot_every == 0:
            torch.save(model.state_dict(), snapshot_path(checkpoint, state.step))
        if time.monotonic() - last_save > config.checkpoint_seconds:
            save_checkpoint(checkpoint, model, optimizer, state)
            last_save = time.monotonic()
    bar.close()
    save_checkpoint(checkpoint, model, optimizer, state)
    model.eval()
    return state
