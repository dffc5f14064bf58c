"""``draftwise zoo build``: corpus → tokenizer → token streams → target → teacher labels → drafters.

Every stage is a registered function that skips itself when its outputs exist, and the two
training stages checkpoint as they go, so re-running an interrupted build resumes it. All
randomness comes from the budget's seed (recorded in ``build.json``); on CPU a rebuild gives
the same weights.

Build folder layout::

    corpus/{train,dev,test}/DOMAIN.jsonl   the examples (dev/test are never trained on)
    tokenizer/                             the HF tokenizer
    tokens/target_mix.npy, tokens/DOMAIN.npy
    checkpoints/NAME.pt                    resumable training state (not shipped)
    teacher/DOMAIN.npz                     the target's top-k next-token log-probs
    models/NAME/                           finished HF checkpoints (config, safetensors, tokenizer)
    build.json                             budget, seeds, figures (times, tokens, losses, sizes)
"""

from __future__ import annotations

import json
import logging
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from tqdm.auto import tqdm
from transformers import AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerFast

from draftwise.errors import DraftwiseError
from draftwise.registry import Registry
from draftwise.training.budgets import BUDGETS, BuildBudget
from draftwise.training.corpus import (
    DOMAINS,
    SPECIALIST_DOMAINS,
    build_corpus,
    corpus_text_sample,
    describe,
    read_corpus,
    write_corpus,
)
from draftwise.training.tokenizer import EOS, PAD, build_tokenizer, encode_examples
from draftwise.training.train import (
    SpecialIds,
    TrainConfig,
    chunk_stream,
    count_params,
    distill_loss,
    new_model,
    next_token_loss,
    train_loop,
)

log = logging.getLogger(__name__)

GENERALIST = "generalist"
TARGET = "target"


@dataclass(frozen=True)
class BuildContext:
    data: Path
    out: Path
    budget: BuildBudget
    progress: bool

    def path(self, *parts: str) -> Path:
        return self.out.joinpath(*parts)


StageFn = Callable[[BuildContext], None]
STAGES: Registry[StageFn] = Registry("zoo build stage")
STAGE_ORDER: list[str] = []


def stage(name: str) -> Callable[[StageFn], StageFn]:
    def decorate(fn: StageFn) -> StageFn:
        STAGE_ORDER.append(name)
        return STAGES.register(name)(fn)

    return decorate


# ----------------------------------------------------------------------------- metadata


def read_meta(ctx: BuildContext) -> dict:
    path = ctx.path("build.json")
    return json.loads(path.read_text()) if path.exists() else {}


def update_meta(ctx: BuildContext, **entries: object) -> None:
    meta = read_meta(ctx)
    meta.update(entries)
    ctx.path("build.json").write_text(json.dumps(meta, indent=2, sort_keys=True, default=str))


def environment() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "machine": platform.machine(),
        "threads": str(torch.get_num_threads()),
    }


# ----------------------------------------------------------------------------- helpers


def load_tokenizer(ctx: BuildContext) -> PreTrainedTokenizerFast:
    tokenizer: Any = AutoTokenizer.from_pretrained(str(ctx.path("tokenizer")))
    return tokenizer


def special_ids(tokenizer: PreTrainedTokenizerFast) -> SpecialIds:
    pad, eos = tokenizer.convert_tokens_to_ids(PAD), tokenizer.convert_tokens_to_ids(EOS)
    assert isinstance(pad, int) and isinstance(eos, int), "one token each"
    return SpecialIds(pad=pad, eos=eos)


def concat(token_lists: list[list[int]]) -> np.ndarray:
    if not token_lists:
        return np.zeros(0, dtype=np.int32)
    return np.concatenate([np.asarray(t, dtype=np.int32) for t in token_lists])


def mix_examples(token_lists: list[list[int]], passes: float, rng: np.random.Generator) -> list[list[int]]:
    """``passes`` passes over a domain's examples: whole passes reshuffled, a fraction subsampled."""
    chosen: list[list[int]] = []
    remaining = passes
    while remaining > 1e-9:
        order = rng.permutation(len(token_lists))
        take = order if remaining >= 1 else order[: round(remaining * len(token_lists))]
        chosen.extend(token_lists[i] for i in take)
        remaining -= 1
    return chosen


def save_hf(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))


def model_done(ctx: BuildContext, name: str) -> bool:
    return (ctx.path("models", name, "model.safetensors")).exists()


# ----------------------------------------------------------------------------- stages


@stage("corpus")
def corpus_stage(ctx: BuildContext) -> None:
    if ctx.path("corpus", "DONE").exists():
        return
    b = ctx.budget
    corpus = build_corpus(ctx.data, b.limits, b.n_dev, b.n_test, seed=b.seed)
    write_corpus(corpus, ctx.path("corpus"))
    ctx.path("corpus", "DONE").write_text("ok\n")
    update_meta(ctx, corpus=describe(corpus))


@stage("tokenizer")
def tokenizer_stage(ctx: BuildContext) -> None:
    if ctx.path("tokenizer", "tokenizer.json").exists():
        return
    corpus = read_corpus(ctx.path("corpus"))
    texts = corpus_text_sample(corpus, ctx.budget.tokenizer_chars_per_domain)
    build_tokenizer(texts, ctx.budget.vocab_size, ctx.budget.target_shape.max_positions, ctx.path("tokenizer"))


@stage("tokens")
def tokens_stage(ctx: BuildContext) -> None:
    if ctx.path("tokens", "target_mix.npy").exists():
        return
    tokenizer = load_tokenizer(ctx)
    corpus = read_corpus(ctx.path("corpus"))
    rng = np.random.default_rng([ctx.budget.seed, 1])
    ctx.path("tokens").mkdir(parents=True, exist_ok=True)
    mix: list[list[int]] = []
    counts: dict[str, int] = {}
    for domain in tqdm(DOMAINS, desc="tokenize", disable=not ctx.progress):
        encoded = encode_examples(tokenizer, corpus.train[domain])
        np.save(ctx.path("tokens", f"{domain}.npy"), concat(encoded))
        counts[domain] = int(sum(len(t) for t in encoded))
        mix.extend(mix_examples(encoded, ctx.budget.target_mix.get(domain, 1.0), rng))
    order = rng.permutation(len(mix))
    stream = concat([mix[i] for i in order])
    np.save(ctx.path("tokens", "target_mix.npy"), stream)
    update_meta(ctx, train_tokens_per_domain=counts, target_mix_tokens=len(stream))


@stage("target")
def target_stage(ctx: BuildContext) -> None:
    if model_done(ctx, TARGET):
        return
    b = ctx.budget
    tokenizer = load_tokenizer(ctx)
    ids = special_ids(tokenizer)
    rows = torch.from_numpy(chunk_stream(np.load(ctx.path("tokens", "target_mix.npy")), b.target_train.seq_len))
    model = new_model(b.target_shape, len(tokenizer), ids, seed=b.seed)
    ctx.path("checkpoints").mkdir(parents=True, exist_ok=True)
    log.info("target: %d params, %d rows of %d tokens", count_params(model), len(rows), b.target_train.seq_len)

    def loss_of_rows(m: LlamaForCausalLM, index: np.ndarray) -> torch.Tensor:
        return next_token_loss(m, rows[torch.from_numpy(index)].long(), ids.pad)

    state = train_loop(
        model, len(rows), loss_of_rows, b.target_train, b.seed, ctx.path("checkpoints", "target.pt"), "target",
        ctx.progress,
    )
    save_hf(model, tokenizer, ctx.path("models", TARGET))
    update_meta(ctx, target={"params": count_params(model), "shape": asdict(b.target_shape), **asdict(state)})


@torch.no_grad()
def teacher_top_k(
    model: LlamaForCausalLM, rows: torch.Tensor, k: int, batch: int, progress: bool, label: str
) -> tuple[np.ndarray, np.ndarray]:
    """The model's k most likely next tokens at every position of every row, with log-probs."""
    ids_out = np.zeros((*rows.shape, k), dtype=np.int16)
    logprobs_out = np.zeros((*rows.shape, k), dtype=np.float16)
    for start in tqdm(range(0, len(rows), batch), desc=label, disable=not progress, mininterval=5.0):
        logits = model(input_ids=rows[start : start + batch].long()).logits.float()  # (B, T, V)
        top = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
        ids_out[start : start + batch] = top.indices.numpy().astype(np.int16)
        logprobs_out[start : start + batch] = top.values.numpy().astype(np.float16)
    return ids_out, logprobs_out


@stage("teacher")
def teacher_stage(ctx: BuildContext) -> None:
    b = ctx.budget
    target = LlamaForCausalLM.from_pretrained(str(ctx.path("models", TARGET)), dtype=torch.float32).eval()
    ctx.path("teacher").mkdir(parents=True, exist_ok=True)
    for domain in DOMAINS:
        path = ctx.path("teacher", f"{domain}.npz")
        if path.exists():
            continue
        stream = np.load(ctx.path("tokens", f"{domain}.npy"))[: b.distill_tokens]
        rows = torch.from_numpy(chunk_stream(stream, b.drafter_train.seq_len))
        started = time.perf_counter()
        top_ids, top_logprobs = teacher_top_k(target, rows, b.teacher_top_k, 16, ctx.progress, f"teacher {domain}")
        np.savez(path, rows=rows.numpy(), ids=top_ids, logprobs=top_logprobs)
        log.info("teacher %s: %d tokens in %.0fs", domain, rows.numel(), time.perf_counter() - started)


def load_teacher(ctx: BuildContext, domains: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    parts = [np.load(ctx.path("teacher", f"{d}.npz")) for d in domains]
    rows = torch.from_numpy(np.concatenate([p["rows"] for p in parts]))
    ids = torch.from_numpy(np.concatenate([p["ids"] for p in parts]))
    logprobs = torch.from_numpy(np.concatenate([p["logprobs"] for p in parts]))
    return rows, ids, logprobs


def drafter_plan(budget: BuildBudget) -> dict[str, tuple[tuple[str, ...], TrainConfig]]:
    """Drafter name → (domains it is distilled on, its training schedule)."""
    plan: dict[str, tuple[tuple[str, ...], TrainConfig]] = {d: ((d,), budget.drafter_train) for d in SPECIALIST_DOMAINS}
    general = budget.drafter_train
    steps = round(general.steps * budget.generalist_steps_factor)
    plan[GENERALIST] = (
        DOMAINS,
        TrainConfig(steps, general.batch, general.seq_len, general.lr, general.warmup, general.weight_decay,
                    general.clip, general.checkpoint_seconds),
    )
    return plan


def distill_drafter(ctx: BuildContext, name: str, domains: tuple[str, ...], config: TrainConfig) -> None:
    b = ctx.budget
    tokenizer = load_tokenizer(ctx)
    rows, top_ids, top_logprobs = load_teacher(ctx, domains)
    # every drafter starts from the same initialisation; only its data differs
    model = new_model(b.drafter_shape, len(tokenizer), special_ids(tokenizer), seed=b.seed + 1)

    def loss_of_rows(m: LlamaForCausalLM, index: np.ndarray) -> torch.Tensor:
        picked = torch.from_numpy(index)
        return distill_loss(m, rows[picked].long(), top_ids[picked], top_logprobs[picked])

    state = train_loop(
        model, len(rows), loss_of_rows, config, b.seed + 2, ctx.path("checkpoints", f"{name}.pt"), name, ctx.progress
    )
    save_hf(model, tokenizer, ctx.path("models", name))
    drafters = read_meta(ctx).get("drafters", {})
    drafters[name] = {
        "domains": list(domains),
        "params": count_params(model),
        "shape": asdict(b.drafter_shape),
        "distill_tokens": int(rows.numel()),
        **asdict(state),
    }
    update_meta(ctx, drafters=drafters)


@stage("drafters")
def drafters_stage(ctx: BuildContext) -> None:
    for name, (domains, config) in drafter_plan(ctx.budget).items():
        if not model_done(ctx, name):
            distill_drafter(ctx, name, domains, config)


# ----------------------------------------------------------------------------- entry point


def run_build(
    data: Path, out: Path, budget_name: str, until: str | None = None, progress: bool = False, threads: int = 2
) -> Path:
    """Run (or resume) every stage up to and including ``until``; returns the models folder.

    ``threads``: torch CPU threads. Bitwise-identical rebuilds need the same thread count; on a
    shared 2-core machine 1 thread beats 2 threads competing with another busy process.
    """
    budget = BUDGETS.get(budget_name)
    if until is not None and until not in STAGES:
        STAGES.get(until)  # raises with the list of valid stages
    if threads < 1:
        raise DraftwiseError(f"zoo build: --threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)
    out.mkdir(parents=True, exist_ok=True)
    ctx = BuildContext(data=data, out=out, budget=budget, progress=progress)
    previous = read_meta(ctx).get("budget")
    if previous is not None and previous.get("name") != budget.name:
        raise DraftwiseError(f"zoo build: {out} holds a '{previous.get('name')}' build; use another --out")
    update_meta(ctx, budget=asdict(budget), seed=budget.seed, environment=environment(), data=str(data))
    for name in STAGE_ORDER:
        started = time.perf_counter()
        STAGES.get(name)(ctx)
        seconds = read_meta(ctx).get("stage_seconds", {})
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - started
        update_meta(ctx, stage_seconds=seconds)
        log.info("stage %s done", name)
        if name == until:
            break
    return ctx.path("models")
