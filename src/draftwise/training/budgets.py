"""Named build budgets: everything that sizes a zoo build, frozen and recorded in its metadata."""

from __future__ import annotations

from dataclasses import dataclass, field

from draftwise.registry import Registry
from draftwise.training.corpus import SourceLimits
from draftwise.training.train import ModelShape, TrainConfig


@dataclass(frozen=True)
class BuildBudget:
    name: str
    limits: SourceLimits
    n_dev: int  # held-out dev examples per domain
    n_test: int  # held-out test examples per domain
    vocab_size: int
    tokenizer_chars_per_domain: int  # tokenizer training text per domain
    target_shape: ModelShape
    target_train: TrainConfig
    # how many passes over each domain's train examples the target mix takes (< 1 subsamples)
    target_mix: dict[str, float] = field(hash=False)
    drafter_shape: ModelShape = ModelShape(1, 128, 384, 4)
    distill_tokens: int = 200_000  # per domain: tokens the target labels for distillation
    teacher_top_k: int = 16
    # 660 steps (2.7M tokens seen, ≈ 13 passes over a specialist's 200k labels): at 220 the drafters
    # were undertrained (loss still falling fast); 660 took the code drafter's in-domain MAT on the
    # dev split from 2.55 to 3.40 (docs/zoo.md; `draftwise zoo eval` repeats it)
    drafter_train: TrainConfig = TrainConfig(steps=660, batch=16, seq_len=256, lr=3e-3, warmup=50)
    generalist_steps_factor: float = 1.0  # the generalist gets a specialist's compute, spread over every domain
    seed: int = 20261121


BUDGETS: Registry[BuildBudget] = Registry("zoo build budget")

FULL_MIX = {
    "code": 1.0,
    "math": 1.0,
    "sql": 0.25,  # WikiSQL alone is ~4M tokens of near-identical queries
    "translation": 1.5,
    "summarization": 1.0,
    "qa": 2.0,
    "general": 1.5,
}

BUDGETS.register("full")(
    BuildBudget(
        name="full",
        limits=SourceLimits(),
        n_dev=100,
        n_test=100,
        vocab_size=8192,
        tokenizer_chars_per_domain=2_000_000,
        target_shape=ModelShape(layers=4, hidden=384, intermediate=1024, heads=6),
        target_train=TrainConfig(steps=1100, batch=8, seq_len=512, lr=1.5e-3, warmup=100),
        target_mix=FULL_MIX,
    )
)

BUDGETS.register("tiny")(
    BuildBudget(
        name="tiny",
        limits=SourceLimits(max_train=150, max_stdlib_files=25),
        n_dev=3,
        n_test=3,
        vocab_size=400,
        tokenizer_chars_per_domain=20_000,
        target_shape=ModelShape(layers=1, hidden=64, intermediate=128, heads=2, max_positions=256),
        target_train=TrainConfig(steps=12, batch=4, seq_len=64, lr=3e-3, warmup=2, checkpoint_seconds=5.0),
        target_mix=FULL_MIX,
        drafter_shape=ModelShape(layers=1, hidden=32, intermediate=64, heads=2, max_positions=256),
        distill_tokens=4_000,
        teacher_top_k=4,
        drafter_train=TrainConfig(steps=6, batch=4, seq_len=64, lr=3e-3, warmup=2, checkpoint_seconds=5.0),
        generalist_steps_factor=1.0,
    )
)
