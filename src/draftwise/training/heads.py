"""Train the zoo's white-box heads on the zoo target: EAGLE (a generalist and per-domain specialists)
and one Medusa set.

Stages, each skipped when its output exists (so an interrupted run resumes; the training loops
checkpoint as they go and end with the same weights on CPU):

1. ``hidden``: the target reads each domain's training text once; its final hidden states
   (fp16) and top-k next-token log-probabilities are stored per domain.
2. ``eagle-generalist`` on every domain; ``eagle-DOMAIN`` fine-tuned from it on one domain (as
   HedgeSpec's domain drafters are fine-tuned from the generic EAGLE); ``medusa`` on every domain.

EAGLE's loss (Li et al. 2024): smooth-L1 regression of the next hidden state plus ``ce_weight`` ×
cross-entropy of the target's next-token distribution (its top-k, renormalised) through the frozen
LM head; inputs carry a little noise so the head tolerates its own imperfect features when it
drafts on them. Medusa's: the same cross-entropy, head j against the target's distribution j steps
ahead.

Output folder::

    hidden/DOMAIN.npz                  tokens, hidden states, top-k of the target
    checkpoints/NAME.pt                resumable training state
    heads/NAME/                        finished head checkpoints (config.json, model.safetensors, fp16)
    heads.json                         budget, seed, losses, timings
"""

from __future__ import annotations

import functools
import json
import logging
import operator
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open

from draftwise.drafters.eagle import EagleHead, eagle_config
from draftwise.drafters.medusa import MedusaHeads, medusa_config
from draftwise.drafters.whitebox import (
    HeadConfig,
    lm_head_fingerprint,
    load_head_weights,
    read_head_config,
    save_head,
    target_dims,
)
from draftwise.errors import DraftwiseError
from draftwise.registry import Registry
from draftwise.training.budgets import BUDGETS
from draftwise.training.corpus import DOMAINS, SPECIALIST_DOMAINS, build_corpus, read_corpus
from draftwise.training.tokenizer import encode_examples
from draftwise.training.train import TrainConfig, TrainState, chunk_stream, train_loop
from draftwise.zoo.load import MANIFEST, read_manifest, shipped_models_dir

log = logging.getLogger(__name__)

GENERALIST = "eagle-generalist"
MEDUSA = "medusa"


@dataclass(frozen=True)
class HeadsBudget:
    name: str
    corpus_budget: str  # which zoo build budget's corpus settings (limits, splits, seed) to rebuild from raw data
    collect_tokens: int  # per domain: training tokens the target reads for hidden states
    seq_len: int  # rows the heads train on
    generalist: TrainConfig
    specialist: TrainConfig  # fine-tuning from the generalist, per domain
    medusa: TrainConfig
    medusa_heads: int = 3
    eagle_intermediate: int = 0  # 0: 4/3 × hidden (a lean layer: the zoo must stay ≤ 60 MB)
    top_k: int = 16  # the target's next-token distribution, kept as its top-k
    ce_weight: float = 0.1  # EAGLE's classification weight next to the regression's 1.0
    unroll: int = 2  # EAGLE draft steps trained (2: also the first step on the head's own prediction)
    feature_noise: float = 0.05  # std of the input noise, relative to the features' std
    seed: int = 20261122


HEADS_BUDGETS: Registry[HeadsBudget] = Registry("heads budget")

# Sized for ≈ 40 minutes on 2 shared CPU cores with the 4 × 384 zoo target (vocabulary 8192), measured
# with 1 thread beside the zoo build: the target reads ≈ 3.8 k tokens/s (7 × 96 k tokens: 3 min); an
# EAGLE step of 8 × 128 positions with 2 unrolled draft steps takes 0.48 s (2000 + 6 × 250 steps:
# 28 min), a Medusa step 0.47 s (800 steps: 6 min). Hidden states: 7 × 96 k × 384 fp16 = 520 MB on disk.
HEADS_BUDGETS.register("full")(HeadsBudget(
    name="full", corpus_budget="full", collect_tokens=96_000, seq_len=128,
    generalist=TrainConfig(steps=2000, batch=8, seq_len=128, lr=2e-3, warmup=100, weight_decay=0.0),
    specialist=TrainConfig(steps=250, batch=8, seq_len=128, lr=1e-3, warmup=20, weight_decay=0.0),
    medusa=TrainConfig(steps=800, batch=8, seq_len=128, lr=2e-3, warmup=50, weight_decay=0.0),
    eagle_intermediate=320,  # 7 EAGLE heads at 1.06 M parameters (2.1 MB in fp16) keep the zoo under 60 MB
))
HEADS_BUDGETS.register("tiny")(HeadsBudget(
    name="tiny", corpus_budget="tiny", collect_tokens=2_000, seq_len=32,
    generalist=TrainConfig(steps=8, batch=4, seq_len=32, lr=3e-3, warmup=2, weight_decay=0.0, checkpoint_seconds=5.0),
    specialist=TrainConfig(steps=3, batch=4, seq_len=32, lr=1e-3, warmup=1, weight_decay=0.0, checkpoint_seconds=5.0),
    medusa=TrainConfig(steps=4, batch=4, seq_len=32, lr=3e-3, warmup=1, weight_decay=0.0, checkpoint_seconds=5.0),
    top_k=4,
))


# -- collecting the target's hidden states ---------------------------------------------------------------
@dataclass
class HiddenSet:
    """Rows of training text with the target's view of them."""

    tokens: torch.Tensor  # (N, T) long
    hidden: torch.Tensor  # (N, T, H) fp16: final hidden state after each token
    top_ids: torch.Tensor  # (N, T, k) long: the target's k most likely next tokens
    top_logprobs: torch.Tensor  # (N, T, k) fp16

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def batch(self, index: np.ndarray) -> HiddenSet:
        picked = torch.from_numpy(index)
        return HiddenSet(self.tokens[picked], self.hidden[picked].float(), self.top_ids[picked],
                         self.top_logprobs[picked].float())


@torch.inference_mode()
def collect_hidden(target: Any, stream: np.ndarray, seq_len: int, top_k: int, batch: int = 8) -> HiddenSet:
    """Run the target over ``stream`` cut into rows of ``seq_len``: hidden states and top-k log-probs."""
    rows = torch.from_numpy(chunk_stream(stream, seq_len).astype(np.int64))
    if not len(rows):
        raise DraftwiseError(f"heads: a token stream of {len(stream)} tokens holds no row of {seq_len}")
    hidden, ids, logprobs = [], [], []
    for start in range(0, len(rows), batch):
        out = target(input_ids=rows[start : start + batch], output_hidden_states=True)
        top = torch.log_softmax(out.logits.float(), -1).topk(top_k, dim=-1)
        hidden.append(out.hidden_states[-1].half())
        ids.append(top.indices)
        logprobs.append(top.values.half())
    return HiddenSet(rows, torch.cat(hidden), torch.cat(ids), torch.cat(logprobs))


def save_hidden(data: HiddenSet, path: Path) -> None:
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, tokens=data.tokens.numpy().astype(np.int32), hidden=data.hidden.numpy(),
             top_ids=data.top_ids.numpy().astype(np.int32), top_logprobs=data.top_logprobs.numpy())
    tmp.replace(path)


def load_hidden(paths: Sequence[Path], axis: int = 0) -> HiddenSet:
    """The sets in ``paths`` joined along ``axis`` (0: more rows; 1: longer rows)."""
    parts = [np.load(p) for p in paths]
    cat = lambda key: torch.from_numpy(np.concatenate([p[key] for p in parts], axis))
    return HiddenSet(cat("tokens").long(), cat("hidden"), cat("top_ids").long(), cat("top_logprobs"))


# -- losses (pure functions of a batch) ------------------------------------------------------------------------
def soft_cross_entropy(features: torch.Tensor, lm_weight: torch.Tensor, top_ids: torch.Tensor,
                       top_logprobs: torch.Tensor) -> torch.Tensor:
    """−Σ p̃ log q: q = softmax(LM head(features)), p̃ the target's top-k renormalised. (…, H), (…, k).

    An id of −1 is a token the head cannot propose (outside its vocabulary subset): left out of p̃; a
    position with none of its top-k in the subset teaches nothing."""
    return soft_targets_loss(features @ lm_weight.T, top_ids, top_logprobs)


def soft_targets_loss(logits: torch.Tensor, top_ids: torch.Tensor, top_logprobs: torch.Tensor) -> torch.Tensor:
    """−Σ p̃ log q for logits (…, V) against the teacher's top-k (…, k) ids (−1: left out) and log-probs
    renormalised over the ids kept: the KL to that distribution, up to its entropy."""
    log_q = torch.log_softmax(logits.float(), -1)
    known = top_ids >= 0
    teacher = torch.softmax(top_logprobs.masked_fill(~known, float("-inf")), -1).nan_to_num(0.0)
    return -(teacher * log_q.gather(-1, top_ids.clamp(min=0))).sum(-1).mean()


def eagle_loss(head: EagleHead, embed_weight: torch.Tensor, lm_weight: torch.Tensor, data: HiddenSet,
               ce_weight: float, noise: float, generator: torch.Generator | None = None,
               unroll: int = 1, inputs: torch.Tensor | None = None) -> torch.Tensor:
    """Pair i = (h_i, x_{i+1}) predicts h_{i+1}; its LM-head output is scored against the target at i + 1.

    With ``unroll`` > 1 the draft steps that run on the head's own predictions are trained too
    (:func:`eagle_unrolled`); each step's loss weighs the same. ``inputs`` (B, T, L × H): the target's
    layers a fusing head reads (default: the final hidden states, ``data.hidden``).
    """
    features = (data.hidden if inputs is None else inputs)[:, :-1]
    if noise > 0:
        features = features + noise * features.std() * torch.randn(features.shape, generator=generator)
    steps = eagle_unrolled(head, features, data.tokens, embed_weight, unroll)
    losses = [_step_loss(p, data, s + 1, lm_weight, ce_weight) for s, p in enumerate(steps)]
    return functools.reduce(operator.add, losses) / len(steps)


def eagle_unrolled(head: EagleHead, features: torch.Tensor, tokens: torch.Tensor, embed_weight: torch.Tensor,
                   unroll: int) -> list[torch.Tensor]:
    """The head's predictions at draft steps 1…``unroll``, teacher tokens as the drafted ones.

    Step 1: pair i = (h_i, x_{i+1}) at position i → ĥ_{i+1}, for every i (``features`` (B, T − 1, H)
    are the h_i, ``tokens`` (B, T)). Step s ≥ 2 of chain m (in the spirit of EAGLE-3's training-time
    test): the pair (ĥ_{m+s−1}, x_{m+s}) at position m + s − 1, attending — exactly as when drafting —
    to the true pairs 0…m and to its own chain's earlier steps; it predicts h_{m+s}. Returns
    (B, T − 1, H) for step 1, then (B, T − unroll, H) per step (chains m < T − unroll).
    """
    embeds = F.embedding(tokens[:, 1:], embed_weight)
    positions = torch.arange(features.shape[1]).expand(features.shape[0], -1)
    predicted, past = head(features, embeds, positions)
    out = [predicted]
    length = tokens.shape[1]
    chains = length - unroll  # chain m needs tokens up to m + unroll
    if unroll < 2 or chains < 1:
        return out
    masks = [torch.ones(chains, length - 1, dtype=torch.bool).tril()]  # chain m sees true pairs j ≤ m
    features = predicted[:, :chains]
    for step in range(2, unroll + 1):
        embeds = F.embedding(tokens[:, step : step + chains], embed_weight)
        positions = (torch.arange(chains) + step - 1).expand(features.shape[0], -1)
        masks.append(torch.eye(chains, dtype=torch.bool))  # its own pair at each step so far
        features, (k, v) = head(features, embeds, positions, past, torch.cat(masks, 1))
        past = (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        out.append(features)
    return out


def _step_loss(predicted: torch.Tensor, data: HiddenSet, ahead: int, lm_weight: torch.Tensor,
               ce_weight: float) -> torch.Tensor:
    """Regression to h at ``ahead`` + i and soft CE against the target there, for predictions (B, n, H)."""
    n = predicted.shape[1]
    truth = data.hidden[:, ahead : ahead + n]
    ce = soft_cross_entropy(predicted, lm_weight, data.top_ids[:, ahead : ahead + n],
                            data.top_logprobs[:, ahead : ahead + n])
    return F.smooth_l1_loss(predicted, truth) + ce_weight * ce


def batch_noise(seed: int, index: np.ndarray) -> torch.Generator:
    """The generator of one batch's input noise: a pure function of the seed and the batch's rows
    (themselves a function of seed and step), so a resumed run draws what an uninterrupted one does."""
    return torch.Generator().manual_seed(int(np.random.default_rng([seed, *index.tolist()]).integers(1 << 62)))


def medusa_loss(heads: MedusaHeads, lm_weight: torch.Tensor, data: HiddenSet) -> torch.Tensor:
    """Head j (0-based) on h_i guesses x_{i+j+2}: scored against the target's distribution at i + j + 1."""
    features = heads(data.hidden)  # (k, B, T, H)
    losses = []
    for j in range(features.shape[0]):
        ahead = j + 1
        losses.append(soft_cross_entropy(features[j][:, :-ahead], lm_weight, data.top_ids[:, ahead:],
                                         data.top_logprobs[:, ahead:]))
    return torch.stack(losses).mean()


# -- the run -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HeadsContext:
    target: Any
    target_name: str
    out: Path
    budget: HeadsBudget
    progress: bool

    def path(self, *parts: str) -> Path:
        return self.out.joinpath(*parts)


def head_plan(budget: HeadsBudget) -> dict[str, tuple[str, tuple[str, ...], TrainConfig]]:
    """Head name → (kind, domains it trains on, schedule); the generalist first (specialists start from it)."""
    plan: dict[str, tuple[str, tuple[str, ...], TrainConfig]] = {GENERALIST: ("eagle", DOMAINS, budget.generalist)}
    plan.update({f"eagle-{d}": ("eagle", (d,), budget.specialist) for d in SPECIALIST_DOMAINS})
    plan[MEDUSA] = ("medusa", DOMAINS, budget.medusa)
    return plan


def head_config(ctx: HeadsContext, kind: str, domains: tuple[str, ...]) -> HeadConfig:
    hidden, vocab = target_dims(ctx.target)
    extra: dict[str, Any] = dict(target=ctx.target_name, target_fingerprint=lm_head_fingerprint(ctx.target),
                                 domains=domains, rms_norm_eps=float(getattr(ctx.target.config, "rms_norm_eps", 1e-6)))
    if kind == "eagle":
        return eagle_config(hidden, vocab, intermediate_size=ctx.budget.eagle_intermediate, **extra)
    return medusa_config(hidden, vocab, ctx.budget.medusa_heads, **extra)


def read_summary(ctx: HeadsContext) -> dict:
    path = ctx.path("heads.json")
    return json.loads(path.read_text()) if path.exists() else {}


def update_summary(ctx: HeadsContext, **entries: Any) -> None:
    summary = read_summary(ctx)
    summary.update(entries)
    ctx.path("heads.json").write_text(json.dumps(summary, indent=2, sort_keys=True, default=str))


def collect_stage(ctx: HeadsContext, streams: Callable[[], dict[str, np.ndarray]]) -> None:
    """Hidden states per domain (``streams`` is only called when some domain is missing)."""
    missing = [d for d in DOMAINS if not ctx.path("hidden", f"{d}.npz").exists()]
    if not missing:
        return
    ctx.path("hidden").mkdir(parents=True, exist_ok=True)
    by_domain = streams()
    for domain in missing:
        started = time.perf_counter()
        stream = by_domain[domain][: ctx.budget.collect_tokens]
        data = collect_hidden(ctx.target, stream, ctx.budget.seq_len, ctx.budget.top_k)
        save_hidden(data, ctx.path("hidden", f"{domain}.npz"))
        log.info("hidden %s: %d tokens in %.0fs", domain, data.tokens.numel(), time.perf_counter() - started)


def train_head(ctx: HeadsContext, name: str, kind: str, domains: tuple[str, ...], config: TrainConfig,
               init_from: Path | None = None) -> TrainState:
    """Train one head (resuming from its checkpoint) and save it under heads/NAME."""
    b = ctx.budget
    data = load_hidden([ctx.path("hidden", f"{d}.npz") for d in domains])
    head_cfg = head_config(ctx, kind, domains)
    torch.manual_seed(b.seed)
    module = EagleHead(head_cfg) if kind == "eagle" else MedusaHeads(head_cfg)
    if init_from is not None:
        load_head_weights(module, init_from)
    embed = ctx.target.get_input_embeddings().weight.detach().float()
    lm = ctx.target.get_output_embeddings().weight.detach().float()

    def loss_of_rows(model: Any, index: np.ndarray) -> torch.Tensor:
        batch = data.batch(index)
        if kind == "eagle":
            return eagle_loss(model, embed, lm, batch, b.ce_weight, b.feature_noise, batch_noise(b.seed, index),
                              b.unroll)
        return medusa_loss(model, lm, batch)

    ctx.path("checkpoints").mkdir(parents=True, exist_ok=True)
    state = train_loop(module, len(data), loss_of_rows, config, b.seed + 1, ctx.path("checkpoints", f"{name}.pt"),
                       name, ctx.progress)
    save_head(module, head_cfg, ctx.path("heads", name))
    heads = read_summary(ctx).get("heads", {})
    heads[name] = {"kind": kind, "domains": list(domains), "params": sum(p.numel() for p in module.parameters()),
                   "train_tokens": int(data.tokens.numel()), **asdict(state)}
    update_summary(ctx, heads=heads)
    return state


def run_heads(target: Any, target_name: str, streams: Callable[[], dict[str, np.ndarray]], out: Path,
              budget_name: str, progress: bool = False, threads: int = 1) -> Path:
    """Collect hidden states and train every head of the plan (resuming); returns the heads folder."""
    budget = HEADS_BUDGETS.get(budget_name)
    if threads < 1:
        raise DraftwiseError(f"zoo heads: --threads must be ≥ 1, got {threads}")
    torch.set_num_threads(threads)
    out.mkdir(parents=True, exist_ok=True)
    previous = read_summary(HeadsContext(target, target_name, out, budget, progress)).get("budget")
    if previous is not None and previous.get("name") != budget.name:
        raise DraftwiseError(f"zoo heads: {out} holds a '{previous.get('name')}' run; use another --out")
    ctx = HeadsContext(target.eval(), target_name, out, budget, progress)
    update_summary(ctx, budget=asdict(budget), target=target_name)
    seconds = read_summary(ctx).get("stage_seconds", {})
    started = time.perf_counter()
    collect_stage(ctx, streams)
    seconds["hidden"] = seconds.get("hidden", 0.0) + time.perf_counter() - started
    update_summary(ctx, stage_seconds=seconds)
    for name, (kind, domains, config) in head_plan(budget).items():
        if ctx.path("heads", name, "model.safetensors").exists():
            continue
        started = time.perf_counter()
        init = ctx.path("heads", GENERALIST) if kind == "eagle" and name != GENERALIST else None
        train_head(ctx, name, kind, domains, config, init)
        seconds = read_summary(ctx).get("stage_seconds", {})
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - started
        update_summary(ctx, stage_seconds=seconds)
        log.info("head %s done", name)
    return ctx.path("heads")


# -- data and install ------------------------------------------------------------------------------------------
def corpus_streams(data: Path, tokenizer: Any, corpus_budget: str) -> dict[str, np.ndarray]:
    """Each domain's training text as one token stream (examples joined; each ends with EOS).

    ``data`` is a zoo build folder (its corpus is reused: exactly the target's training split) or
    the shared data folder (the corpus is rebuilt with the build budget's settings and seed, which
    gives the same split).
    """
    if (data / "corpus" / "DONE").exists():
        corpus = read_corpus(data / "corpus")
    else:
        b = BUDGETS.get(corpus_budget)
        corpus = build_corpus(data, b.limits, b.n_dev, b.n_test, seed=b.seed)
    streams = {}
    for domain in DOMAINS:
        encoded = encode_examples(tokenizer, corpus.train[domain])
        if encoded:
            streams[domain] = np.concatenate([np.asarray(t, dtype=np.int64) for t in encoded])
        else:
            streams[domain] = np.zeros(0, np.int64)
    return streams


def install_heads(heads: Path, dest: Path | None = None) -> list[dict[str, Any]]:
    """Copy finished heads into a zoo folder (by default the package's) and list them in its manifest.

    Heads are already fp16 and hold only their own weights; the manifest gets role ``head``
    entries (re-running replaces them). Run it after ``draftwise zoo install``, which rewrites
    the manifest.
    """
    dest = dest or shipped_models_dir()
    manifest = read_manifest(dest)
    entries = []
    for folder in sorted(p for p in heads.iterdir() if (p / "model.safetensors").exists()):
        config = read_head_config(folder)
        if (dest / folder.name).exists():
            shutil.rmtree(dest / folder.name)
        shutil.copytree(folder, dest / folder.name)
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            params = sum(int(np.prod(f.get_slice(k).get_shape())) for k in f.keys())  # noqa: SIM118  (safe_open has no __iter__)
        entries.append({"name": folder.name, "role": "head", "kind": config.kind, "domains": list(config.domains),
                        "params": params})
    names = {e["name"] for e in entries}
    manifest["models"] = [m for m in manifest["models"] if m["name"] not in names] + entries
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return entries
