"""PNG plots from the rows (matplotlib is the optional extra ``plot``; without it plots are skipped).

* ``speedup_by_domain.png`` — speedup over ``ar`` per domain, one bar per method;
* ``best_arm_ratio.png`` — share of rounds so far that played the best drafter (MetaSD Fig. 3);
* ``arm_values.png`` — each arm's running mean reward over rounds (TapOut Fig. 5);
* ``cumulative_regret.png`` — Σ (best single drafter's MAT − tokens emitted) over rounds
  (HedgeSpec Fig. 5a);
* ``mat_vs_drafters.png`` — MAT against the pool size, from ``POLICY@K`` methods (HedgeSpec Fig. 5b).

The series are pure functions of the rows; only ``write_plots`` touches matplotlib.
"""

from __future__ import annotations

import logging
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from draftwise.bench.methods import BASELINE
from draftwise.bench.rows import FIXED, OVERALL, best_fixed, pair, played_best

log = logging.getLogger(__name__)

MAX_LEARNERS = 6  # lines per plot: more is unreadable


def learner_methods(rows: Sequence[dict], methods: Sequence[str]) -> list[str]:
    """Methods whose rounds play more than one arm (policies over a pool)."""
    arms: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        arms[r["method"]].update((r.get("trace") or {}).get("arm") or [])
    return [m for m in methods if len(arms.get(m, ())) > 1][:MAX_LEARNERS]


def mean_curve(curves: Sequence[np.ndarray], carry: bool) -> np.ndarray:
    """Average of per-prompt curves over round index; ``carry`` holds a finished prompt at its last value."""
    if not curves:
        return np.zeros(0)
    length = max(len(c) for c in curves)
    total = np.zeros(length)
    count = np.zeros(length)
    for c in curves:
        if not len(c):
            continue
        padded = np.concatenate([c, np.full(length - len(c), c[-1])]) if carry else c
        total[: len(padded)] += padded
        count[: len(padded)] += 1
    return total / np.maximum(count, 1)


def best_arm_curve(rows: Sequence[dict], method: str) -> np.ndarray:
    best = best_fixed(rows)
    curves = []
    for r in rows:
        arms = (r.get("trace") or {}).get("arm") or []
        if r["method"] == method and pair(r) in best and arms:
            hits = np.array([played_best(a, best[pair(r)][0]) for a in arms], dtype=float)
            curves.append(np.cumsum(hits) / np.arange(1, len(hits) + 1))
    return mean_curve(curves, carry=False)


def regret_curve(rows: Sequence[dict], method: str) -> np.ndarray:
    # the best drafter's MAT on that prompt is what a hindsight-fixed choice earns per round
    best = best_fixed(rows)
    tokens = {(r["method"], pair(r)): r["new_tokens"] for r in rows}
    curves = []
    for r in rows:
        emitted = (r.get("trace") or {}).get("emitted") or []
        if r["method"] == method and pair(r) in best and emitted:
            name, calls = best[pair(r)]
            best_mat = tokens[(FIXED + name, pair(r))] / max(calls, 1)
            curves.append(np.cumsum(best_mat - np.asarray(emitted, dtype=float)))
    return mean_curve(curves, carry=True)


def arm_value_curves(rows: Sequence[dict], method: str) -> dict[str, np.ndarray]:
    """Per arm: the running mean of the rewards it received, averaged over prompts."""
    per_arm: dict[str, list[np.ndarray]] = defaultdict(list)
    for r in rows:
        trace = r.get("trace") or {}
        if r["method"] != method or not trace.get("arm"):
            continue
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        series: dict[str, list[float]] = {a: [] for a in set(trace["arm"])}
        for arm, reward in zip(trace["arm"], trace["reward"]):
            if reward is not None:
                sums[arm] += reward
                counts[arm] += 1
            for a in series:
                series[a].append(sums[a] / counts[a] if counts[a] else np.nan)
        for a, values in series.items():
            per_arm[a].append(np.asarray(values))
    with warnings.catch_warnings():  # rounds before an arm's first pull are all-NaN columns: leave them NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return {a: np.nanmean(_pad_nan(curves), axis=0) for a, curves in sorted(per_arm.items())}


def _pad_nan(curves: Sequence[np.ndarray]) -> np.ndarray:
    length = max(len(c) for c in curves)
    return np.stack([np.concatenate([c, np.full(length - len(c), np.nan)]) for c in curves])


def mat_by_pool_size(full: dict[str, dict[str, Any]], pool_size: int | None) -> dict[str, list[tuple[int, float]]]:
    """base policy → [(K, MAT)] from ``POLICY@K`` methods (and the full-pool ``POLICY`` at K = pool size)."""
    points: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for method, v in full.items():
        base, _, size = method.partition("@")
        mat = v[OVERALL]["mat"]
        if size.isdigit() and mat is not None:
            points[base].append((int(size), mat))
    for base in list(points):
        mat = full.get(base, {}).get(OVERALL, {}).get("mat")
        if pool_size and mat is not None:
            points[base].append((pool_size, mat))
        points[base] = sorted(set(points[base]))
    return dict(points)


# ----------------------------------------------------------------------------- rendering


def write_plots(out: Path, rows: Sequence[dict], full: dict[str, dict[str, Any]], methods: Sequence[str],
                pool_size: int | None) -> list[Path]:
    try:  # matplotlib is optional (the plot extra)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no plots (pip install 'draftwise[plot]')")
        return []
    learners = learner_methods(rows, methods)
    plots: dict[str, Callable[[Any], bool]] = {
        "speedup_by_domain.png": lambda ax: _speedup_bars(ax, full),
        "best_arm_ratio.png": lambda ax: _curves(ax, {m: best_arm_curve(rows, m) for m in learners},
                                                 "round", "share of rounds on the best drafter so far"),
        "cumulative_regret.png": lambda ax: _curves(ax, {m: regret_curve(rows, m) for m in learners},
                                                    "round", "cumulative regret (tokens vs best drafter)"),
        "arm_values.png": lambda ax: _curves(ax, arm_value_curves(rows, learners[0]) if learners else {},
                                             "round",
                                             f"running mean reward per arm ({learners[0] if learners else ''})"),
        "mat_vs_drafters.png": lambda ax: _mat_vs_drafters(ax, mat_by_pool_size(full, pool_size)),
    }
    written = []
    for name, draw in plots.items():
        # the bar chart carries a legend beside it: give it the room
        fig, ax = plt.subplots(figsize=(13, 5) if name == "speedup_by_domain.png" else (8, 4.5))
        try:
            if draw(ax):
                fig.tight_layout()
                fig.savefig(out / name, dpi=110, bbox_inches="tight")
                written.append(out / name)
            else:
                log.info("plot %s skipped: no data for it in this run", name)
        finally:
            plt.close(fig)
    return written


def _speedup_bars(ax: Any, full: dict[str, dict[str, Any]]) -> bool:
    methods = [m for m in full if m != BASELINE and full[m][OVERALL]["speedup"] is not None]
    domains = sorted({d for m in methods for d in full[m]["by_domain"]}) + [OVERALL]
    if not methods:
        return False
    width = 0.8 / len(methods)
    x = np.arange(len(domains))
    for i, m in enumerate(methods):
        values = [(full[m][OVERALL] if d == OVERALL else full[m]["by_domain"].get(d, {})).get("speedup") or 0.0
                  for d in domains]
        ax.bar(x + i * width - 0.4 + width / 2, values, width, label=m)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(x, domains, rotation=20)
    ax.set_ylabel("speedup over ar")
    # beside the axes, not over the bars: with a dozen methods an inner legend hides the data
    ax.legend(fontsize=6, ncol=max(1, len(methods) // 16 + 1), loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return True


def _curves(ax: Any, curves: dict[str, np.ndarray], xlabel: str, ylabel: str) -> bool:
    drawn = False
    for label, y in curves.items():
        if len(y):
            ax.plot(np.arange(1, len(y) + 1), y, label=label)
            drawn = True
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if drawn:
        ax.legend(fontsize=7)
    return drawn


def _mat_vs_drafters(ax: Any, points: dict[str, list[tuple[int, float]]]) -> bool:
    for base, pts in points.items():
        ax.plot([k for k, _ in pts], [m for _, m in pts], marker="o", label=base)
    ax.set_xlabel("number of drafters")
    ax.set_ylabel("MAT")
    if points:
        ax.legend(fontsize=7)
    return bool(points)
