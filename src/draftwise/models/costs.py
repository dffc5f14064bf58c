"""What the target's forwards cost on the machine it runs on: measured once, kept, refined.

Whether a draft pays depends on what verifying it costs next to a plain step, and that differs from
machine to machine: a 4-token verification costs 1.5× a one-token forward on one CPU and 1.9× on
another, bfloat16 products are 5× dearer than int4 on a CPU without BF16 instructions (BENCHMARKS.md,
"Target numerics"). So each machine measures its own curve — a forward over 1–16 new tokens of one
query, a plain step of 1–16 batch rows — at a target's first load (a few seconds), keeps it in the
draftwise home under a key of the CPU, its thread count, torch, the target and its numerics (another
CPU or thread count measures again), and refines it from the forwards the engine then times.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from draftwise.models import numerics
from draftwise.models.batched_lm import BatchedLM, wait_for
from draftwise.models.cached_lm import CachedLM
from draftwise.models.named_models import draftwise_home
from draftwise.models.numerics import LINEARS, BlockLinear, Int4Linear, computes_exactly, linear_weights
from draftwise.models.numerics_modes import KEEPING

log = logging.getLogger(__name__)

TOKENS = (1, 2, 3, 4, 5, 6, 8, 12, 16)  # new tokens of one query's forward
ROWS = (1, 2, 4, 8, 16)  # rows of a batch's plain step
CONTEXT = 200  # cached tokens before each timed forward: a chat answer's typical length
REPEATS = 5  # forwards timed per point (their median); fewer where BUDGET_S runs out
BUDGET_S = 8.0  # the measurement's time at first load, at most (each point timed once at least)
FORMAT = 1  # the cached file's layout
REFINE = 0.05  # weight of one timed forward in the running correction of its point
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_tile", "fma")


def machine() -> dict[str, Any]:
    """What the costs depend on besides the model: the CPU (its model and the instruction sets the
    kernels choose by), the threads torch uses and torch's version."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        label, _, value = line.partition(":")
        if label.strip() == "model name":
            name = value.strip()
        elif label.strip() == "flags":
            flags = set(value.split())
    return {"cpu": name, "isa": [f for f in CPU_FLAGS if f in flags],
            "capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            "torch": torch.__version__}


def numerics_of(model: Any) -> str:
    """The numerics a loaded target computes in (:mod:`draftwise.models.numerics`), from its layers."""
    if not computes_exactly(model):
        return "native"
    for module in model.modules():
        if isinstance(module, Int4Linear):
            return "int4"
        if isinstance(module, BlockLinear):
            return str(module.dense.dtype).replace("torch.", "")
    return "float32"


def target_identity(model: Any) -> dict[str, Any]:
    """The target as its costs see it: its configuration (the shapes: two copies of a model cost
    alike wherever they are stored), its numerics, its device and the code that runs its forward."""
    config = model.config.to_dict() if hasattr(model.config, "to_dict") else {}
    shape = {k: v for k, v in sorted(config.items())
             if isinstance(v, (int, float, str, bool)) and not k.startswith("_")}
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]
    device = next(model.parameters()).device
    return {"model": str(config.get("_name_or_path") or config.get("model_type") or "model"), "config": digest,
            "numerics": numerics_of(model), "device": str(device), "forward": forward_code()}


@functools.cache
def forward_code() -> str:
    """A digest of the code that runs an exact forward: a release that makes it faster or slower
    gets its costs measured again, not priced on the last one's (a step 18 % faster changes every
    verification's price relative to it)."""
    return hashlib.sha256(Path(numerics.__file__).read_bytes()).hexdigest()[:12]


@dataclass
class CostCurve:
    """Seconds of the target's forwards on this machine: ``tokens_s[k]`` one query's forward over k
    new tokens after CONTEXT cached ones, ``rows_s[b]`` a batch's plain step of b rows. Points
    between those measured are interpolated; past the last, extended along the last two. Each
    point carries a running correction (``scale``) from the forwards the engine times."""

    key: dict[str, Any]
    tokens_s: dict[int, float]
    rows_s: dict[int, float]
    measure_s: float = 0.0
    scale: dict[int, float] = field(default_factory=dict)

    def forward_s(self, tokens: int) -> float:
        """A forward over ``tokens`` new tokens of one query."""
        return interpolate(self.tokens_s, tokens) * self.scale.get(nearest(self.tokens_s, tokens), 1.0)

    def relative(self, tokens: int) -> float:
        """:meth:`forward_s` of ``tokens`` in one-token forwards: what verifying a draft of
        ``tokens − 1`` costs next to a plain step."""
        return self.forward_s(tokens) / self.forward_s(1)

    def step_s(self, rows: int) -> float:
        """A batch's plain step of ``rows`` rows."""
        return interpolate(self.rows_s, rows)

    def observe(self, tokens: int, seconds: float) -> None:
        """One timed forward of one query over ``tokens`` new tokens: its point's correction moves
        toward it (in ratio; a forward 8× off is a stall, not a cost, and is left out)."""
        if tokens < 1 or seconds <= 0:
            return
        point = nearest(self.tokens_s, tokens)
        ratio = seconds / interpolate(self.tokens_s, tokens)
        if 1 / 8 < ratio / self.scale.get(point, 1.0) < 8:
            old = self.scale.get(point, 1.0)
            self.scale[point] = math.exp((1 - REFINE) * math.log(old) + REFINE * math.log(ratio))

    def step_prior(self) -> tuple[float, float, float, float]:
        """A batched step's linear cost (a, b, c, p) of :mod:`draftwise.decision.step_costs` from this
        curve: a + b·R through the rows' plain steps, c (a draft token) and p (a prompt token) the
        one-query curve's cost per extra token up to 8."""
        rows = sorted(self.rows_s)
        b = max(slope(rows, [self.rows_s[r] for r in rows]), 1e-6)
        a = max(statistics.fmean(self.rows_s[r] - b * r for r in rows), 0.0)
        tokens = [k for k in sorted(self.tokens_s) if k <= 8]
        c = max(slope(tokens, [self.forward_s(k) for k in tokens]), 1e-6)
        return a, b, c, c

    def summary(self) -> dict[str, Any]:
        """The curve in milliseconds and in one-token forwards, with its key: for statistics and reports."""
        return {"machine": self.key, "measure_s": round(self.measure_s, 2),
                "forward_ms": {k: round(1000 * self.forward_s(k), 3) for k in sorted(self.tokens_s)},
                "relative": {k: round(self.relative(k), 3) for k in sorted(self.tokens_s)},
                "batch_step_ms": {b: round(1000 * self.step_s(b), 3) for b in sorted(self.rows_s)}}

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "tokens_s": self.tokens_s, "rows_s": self.rows_s, "measure_s": self.measure_s}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CostCurve:
        return cls(data["key"], {int(k): float(v) for k, v in data["tokens_s"].items()},
                   {int(k): float(v) for k, v in data["rows_s"].items()}, float(data.get("measure_s", 0.0)))


def interpolate(points: dict[int, float], x: int) -> float:
    """``points`` (x → y) at ``x``: linear between the measured points, along the last two past them.

    >>> interpolate({1: 10.0, 2: 12.0, 4: 20.0}, 3), interpolate({1: 10.0, 2: 12.0, 4: 20.0}, 6)
    (16.0, 28.0)
    """
    xs = sorted(points)
    if x in points or len(xs) == 1:
        return points.get(x, points[xs[0]])
    if x < xs[0]:
        return points[xs[0]]
    upper = next((i for i, v in enumerate(xs) if v > x), len(xs) - 1)
    x0, x1 = xs[max(upper - 1, 0)], xs[upper]
    return points[x0] + (points[x1] - points[x0]) * (x - x0) / (x1 - x0)


def nearest(points: dict[int, float], x: int) -> int:
    return min(points, key=lambda p: (abs(p - x), p))


def slope(xs: list[int], ys: list[float]) -> float:
    """Least-squares slope of ``ys`` on ``xs`` (0 for fewer than two points).

    >>> slope([1, 2, 4], [3.0, 5.0, 9.0])
    2.0
    """
    if len(xs) < 2:
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / spread if spread else 0.0


def curve_path(key: dict[str, Any], kind: str = "") -> Path:
    """Where what was measured under ``key`` is kept: ``costs/[KIND-]DIGEST.json`` in the draftwise home."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return draftwise_home() / "costs" / f"{kind + '-' if kind else ''}{digest}.json"


def read_kept(path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """What was kept at ``path`` when it was measured under ``key`` (None: nothing kept, another key,
    or unreadable: measured again)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT and data.get("key") == key else None


def keep(path: Path, data: dict[str, Any], what: str) -> None:
    """Written whole or not at all (a temporary file renamed): a reader never sees half of one. A
    read-only home only warns: what was measured still serves this process."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps({"format": FORMAT, **data}, indent=1))
        temporary.replace(path)
    except OSError as error:
        log.warning("could not keep %s in %s: %s", what, path, error)


_loaded: dict[str, CostCurve] = {}  # per key: every Generator of a process on one target shares its curve


def target_costs(model: Any, measure_again: bool = False, budget_s: float = BUDGET_S) -> CostCurve:
    """The target's cost curve on this machine: from the draftwise home where this machine measured
    it before, else measured now (≤ ``budget_s``) and kept there."""
    key = {**machine(), **target_identity(model)}
    text = json.dumps(key, sort_keys=True)
    if not measure_again and text in _loaded:
        return _loaded[text]
    path = curve_path(key)
    kept = None if measure_again else read_kept(path, key)
    curve = None if kept is None else CostCurve.from_json(kept)
    if curve is None:
        curve = measure(model, key, budget_s)
        keep(path, curve.to_json(), "the target's measured costs")
        log.info("measured the target's costs on this machine in %.1f s (kept in %s): one token %.1f ms, "
                 "4 new tokens %.2f×, a batch of 8 %.1f ms", curve.measure_s, path, 1000 * curve.forward_s(1),
                 curve.relative(4), 1000 * curve.step_s(8))
    _loaded[text] = curve
    return curve


@torch.inference_mode()
def measure(model: Any, key: dict[str, Any], budget_s: float = BUDGET_S) -> CostCurve:
    """Time the target's forwards: each point once (warm), then again in turns until REPEATS or the budget."""
    start = time.perf_counter()
    device = next(model.parameters()).device
    vocab = int(model.get_output_embeddings().weight.shape[0])
    generator = torch.Generator().manual_seed(0)

    def tokens(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=generator).tolist()

    context = tokens(CONTEXT)
    single = CachedLM(model)
    single.logits(context)
    batch = BatchedLM(model)
    rows = [batch.add_row() for _ in range(max(ROWS))]
    batch.reserve(len(rows), CONTEXT + 2)
    for row in rows:
        row.logits(context)

    def one_query(k: int) -> Callable[[], None]:
        def run() -> None:
            single.logits(context + tokens(k), k)
        return run

    def batch_step(b: int) -> Callable[[], None]:
        def run() -> None:
            batch.run([row.chain_input(context + tokens(1), 1) for row in rows[:b]])
        return run

    plan = [("tokens", k, one_query(k)) for k in TOKENS] + [("rows", b, batch_step(b)) for b in ROWS]
    times: dict[tuple[str, int], list[float]] = {(kind, n): [] for kind, n, _ in plan}
    for _, _, run in plan:  # warm-up: every shape once, untimed
        run()
    for _ in range(REPEATS):
        for kind, n, run in plan:
            began = time.perf_counter()
            run()
            wait_for(device)
            times[kind, n].append(time.perf_counter() - began)
        if time.perf_counter() - start > budget_s:
            break
    tokens_s = {n: statistics.median(t) for (kind, n), t in times.items() if kind == "tokens"}
    rows_s = {n: statistics.median(t) for (kind, n), t in times.items() if kind == "rows"}
    return CostCurve(key, tokens_s, rows_s, time.perf_counter() - start)


OWN_MODE_MARGIN = 1.25  # the checkpoint's own mode is kept unless another is this much faster: answers
# then stay those of every machine where it is fastest, and auto is never 1.5× slower than the best
PRODUCT_ROWS = (1, 5)  # a plain step's rows and a round's: what the products are timed on


def fastest_keeping(model: Any, precision: str, budget_s: float = 2.0) -> str:
    """The exact numerics ``auto`` computes a checkpoint of ``precision`` in on this machine: of the
    modes that keep its precision (:data:`~draftwise.models.numerics_modes.KEEPING`), its own unless
    another multiplies the model's layers ``OWN_MODE_MARGIN`` times faster here (bfloat16 products
    on a CPU without bfloat16 instructions: 9× float32's). Timed on the model's own layer shapes at
    its first load on a machine (≤ ``budget_s``), kept in the draftwise home."""
    candidates = KEEPING[precision]
    if len(candidates) == 1:
        return candidates[0]
    shapes = linear_shapes(model)
    key = {**machine(), "precision": precision, "shapes": sorted([list(s), n] for s, n in shapes.items())}
    path = curve_path(key, "modes")
    kept = read_kept(path, key)
    if kept is not None and kept.get("choice") in candidates:
        return str(kept["choice"])
    seconds = product_seconds(candidates, shapes, budget_s)
    own, fastest = candidates[0], min(seconds, key=seconds.__getitem__)
    choice = own if seconds[own] <= OWN_MODE_MARGIN * seconds[fastest] else fastest
    log.info("numerics auto: %s on this machine (%s)", choice,
             ", ".join(f"{mode} {1000 * s:.1f} ms" for mode, s in seconds.items()))
    keep(path, {"key": key, "choice": choice, "seconds": seconds}, "the numerics chosen for this machine")
    return choice


def linear_shapes(model: Any) -> dict[tuple[int, int], int]:
    """The model's linear layers, (out, in) → how many."""
    shapes: dict[tuple[int, int], int] = {}
    for module in model.modules():
        weights = linear_weights(module)
        if weights is not None:
            shape = (int(weights[0].shape[0]), int(weights[0].shape[1]))
            shapes[shape] = shapes.get(shape, 0) + 1
    return shapes


@torch.inference_mode()
def product_seconds(modes: tuple[str, ...], shapes: dict[tuple[int, int], int], budget_s: float) -> dict[str, float]:
    """Seconds of one pass of each mode's products over every layer of ``shapes``, on PRODUCT_ROWS
    rows each: per shape the fastest of up to 5 timings, the modes in turns (a busy CPU slows a
    timing, never speeds one up: the fastest is the least disturbed, and turns share a drift alike)."""
    generator = torch.Generator().manual_seed(0)
    total, start = dict.fromkeys(modes, 0.0), time.perf_counter()
    for (out_features, in_features), count in shapes.items():
        weight = torch.randn(out_features, in_features, generator=generator) / in_features**0.5
        layers = {mode: build(weight, None) for mode in modes if (build := LINEARS[mode]) is not None}
        inputs = [torch.randn(rows, in_features, generator=generator) for rows in PRODUCT_ROWS]
        best = dict.fromkeys(layers, math.inf)
        for repeat in range(6):
            for mode, layer in layers.items():
                began = time.perf_counter()
                for x in inputs:
                    layer(x)
                if repeat:  # the first warms up
                    best[mode] = min(best[mode], time.perf_counter() - began)
            if repeat and time.perf_counter() - start > budget_s:
                break
        for mode, seconds in best.items():
            total[mode] += count * seconds
    return total
