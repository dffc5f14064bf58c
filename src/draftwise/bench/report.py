"""Summaries derived from the raw rows: metrics per method × domain, paper-shaped tables, env.json.

Definitions (every ratio against ``ar`` uses only the (prompt, repeat) pairs both have):

* ``speedup`` — (Σ tokens / Σ seconds of the method) / (the same for ``ar``);
* ``speedup_mean_of_prompts`` — Spec-Bench's: mean over prompts of each prompt's tokens/s,
  divided by the same mean for ``ar``;
* ``mat`` — Σ tokens / Σ target forwards; ``target_calls_per_token`` its inverse;
* ``acceptance_rate`` — Σ accepted / Σ drafted (null for the transformers peers: not observable);
* ``mismatches`` — rows whose tokens differ from ``ar``'s on the same prompt and repeat, under
  greedy decoding and under coupled sampling (where one seed fixes the text: draftwise's methods
  must match ``ar`` token for token; the transformers peers sample otherwise and are not compared);
  null where outputs are not compared (rejection sampling: they legitimately differ);
* ``regret`` (csv / md) — stopping-time regret: mean over prompts of the method's target calls
  minus those of the best single drafter on that prompt in hindsight;
* ``best_arm_ratio`` (csv / md) — share of rounds that played that best drafter.
"""

from __future__ import annotations

import csv
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from draftwise.bench.methods import BASELINE
from draftwise.bench.plots import write_plots
from draftwise.bench.rows import (
    FIXED,
    ORACLE,
    OVERALL,
    best_fixed,
    mismatched_keys,
    pair,
    played_best,
    speed,
    with_derived,
)
from draftwise.models.costs import target_costs
from draftwise.models.drafter_bank import resolve_head_dtype

SUMMARY_KEYS = ("speedup", "speedup_mean_of_prompts", "tokens_per_s", "mat", "acceptance_rate",
                "target_calls_per_token", "mismatches")
EXTRA_KEYS = ("speedup_std", "regret", "best_arm_ratio", "prompts", "runs")
NO_DRAFTER = "none"  # the arm of plain decoding rounds
HF_PREFIX = "hf-"  # the transformers peers (hf-ar, hf-pld, hf-assisted:NAME)
OTHER_ENGINES = ("llama-cpp",)  # peers that run the target in their own numerics: their tokens are their own
PACKAGES = ("draftwise", "torch", "transformers", "tokenizers", "safetensors", "numpy", "tqdm", "matplotlib", "ray")


# ----------------------------------------------------------------------------- metrics


def metrics(rows: Sequence[dict], baseline: Sequence[dict], mismatches: set[str] | None,
            best: dict[tuple[str, int], tuple[str, int]]) -> dict[str, Any]:
    """One method's metrics on some rows; ``mismatches`` None: outputs not compared (sampling)."""
    base = {pair(r): r for r in baseline}
    rows = [r for r in rows if pair(r) in base]
    if not rows:
        return {k: None for k in SUMMARY_KEYS + EXTRA_KEYS}
    ref = [base[pair(r)] for r in rows]
    tokens = sum(r["new_tokens"] for r in rows)
    # counts from the rows' JSON; None where a method does not report them
    calls: list[Any] = [r.get("target_calls") for r in rows]
    drafted: list[Any] = [r.get("drafted") for r in rows]
    out: dict[str, Any] = {
        "speedup": ratio(speed(rows), speed(ref)),
        "speedup_mean_of_prompts": ratio(mean_prompt_speed(rows), mean_prompt_speed(ref)),
        "tokens_per_s": speed(rows),
        "mat": tokens / sum(calls) if None not in calls and sum(calls) else None,
        "acceptance_rate": (sum(r["accepted"] for r in rows) / sum(drafted)
                            if None not in drafted and sum(drafted) else None),
        "target_calls_per_token": sum(calls) / tokens if None not in calls and tokens else None,
        "mismatches": None if mismatches is None else sum(r["key"] in mismatches for r in rows),
        "speedup_std": repeat_std(rows, base),
        "regret": mean_or_none([r["target_calls"] - best[pair(r)][1] for r in rows
                                if pair(r) in best and r.get("target_calls") is not None]),
        "best_arm_ratio": best_arm_ratio(rows, best),
        "prompts": len({r["prompt_id"] for r in rows}),
        "runs": len(rows),
    }
    return out


def ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def mean_or_none(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def mean_prompt_speed(rows: Sequence[dict]) -> float:
    per_prompt: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        per_prompt[r["prompt_id"]].append(r)
    return statistics.fmean(speed(v) for v in per_prompt.values())


def repeat_std(rows: Sequence[dict], base: dict[tuple[str, int], dict]) -> float:
    """Standard deviation of the overall speedup across repeats (0 with one repeat)."""
    by_repeat: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        by_repeat[r["repeat"]].append(r)
    values = [ratio(speed(v), speed([base[pair(r)] for r in v])) or 0.0 for v in by_repeat.values()]
    return statistics.stdev(values) if len(values) > 1 else 0.0


def best_arm_ratio(rows: Sequence[dict], best: dict[tuple[str, int], tuple[str, int]]) -> float | None:
    hits = total = 0
    for r in rows:
        arms = [a for a in (r.get("trace") or {}).get("arm") or [] if a != NO_DRAFTER]
        if pair(r) in best and arms:
            hits += sum(played_best(a, best[pair(r)][0]) for a in arms)
            total += len(arms)
    return hits / total if total else None


def compared(method: str, greedy: bool, coupled: bool) -> bool:
    """Whether ``method``'s outputs must equal ``ar``'s: every method under greedy decoding,
    draftwise's own under coupled sampling (the transformers peers draw with their own RNG)."""
    if method.startswith(OTHER_ENGINES):
        return False
    return greedy or (coupled and not method.startswith(HF_PREFIX))


def summarize_rows(rows: Sequence[dict], methods: Sequence[str], greedy: bool,
                   coupled: bool = False) -> dict[str, dict[str, Any]]:
    """method → {"overall": metrics, "by_domain": {domain: metrics}}, with every extra key."""
    rows = with_derived(rows, methods)
    every_bad = mismatched_keys(rows)
    best = best_fixed(rows)
    by_method: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_method[r["method"]].append(r)
    baseline = by_method.get(BASELINE, [])
    domains = sorted({r["domain"] for r in rows})
    out: dict[str, dict[str, Any]] = {}
    for method in methods:
        mine = by_method.get(method, [])
        bad = every_bad if compared(method, greedy, coupled) else None
        out[method] = {
            OVERALL: metrics(mine, baseline, bad, best),
            "by_domain": {d: metrics([r for r in mine if r["domain"] == d], [r for r in baseline if r["domain"] == d],
                                     bad, best) for d in domains},
        }
    return out


def summary_json(full: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The documented schema, exactly: the seven summary keys per method, overall and per domain."""
    def keep(m: dict[str, Any]) -> dict[str, Any]:
        return {k: m[k] for k in SUMMARY_KEYS}

    return {"methods": {method: {OVERALL: keep(v[OVERALL]),
                                 "by_domain": {d: keep(m) for d, m in v["by_domain"].items()}}
                        for method, v in full.items()}}


def total_mismatches(full: dict[str, dict[str, Any]]) -> int:
    return sum(v[OVERALL]["mismatches"] or 0 for v in full.values())


# ----------------------------------------------------------------------------- tables


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def paper_table(full: dict[str, dict[str, Any]], key: str, digits: int = 2) -> str:
    """Rows methods, columns domains then overall; the best non-baseline value of each column in bold."""
    domains = sorted({d for v in full.values() for d in v["by_domain"]})
    columns = domains + [OVERALL]

    def cell(method: str, column: str) -> Any:
        v = full[method]
        return (v[OVERALL] if column == OVERALL else v["by_domain"].get(column, {})).get(key)

    best = {}
    for c in columns:
        values = [cell(m, c) for m in full if m != BASELINE and cell(m, c) is not None]
        best[c] = max(values) if values else None
    lines = ["| method | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for method in full:
        cells = []
        for c in columns:
            value = cell(method, c)
            text = fmt(value, digits)
            cells.append(f"**{text}**" if value is not None and method != BASELINE and value == best[c] else text)
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def overall_table(full: dict[str, dict[str, Any]]) -> str:
    head = ("method", "speedup", "mean-of-prompts", "tokens/s", "MAT", "acceptance", "calls/token", "regret",
            "best-arm ratio", "mismatches", "runs")
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for method, v in full.items():
        m = v[OVERALL]
        speedup = "–" if m["speedup"] is None else f"{m['speedup']:.2f} ± {m['speedup_std']:.2f}"
        cells = [speedup, fmt(m["speedup_mean_of_prompts"]), fmt(m["tokens_per_s"], 1), fmt(m["mat"]),
                 fmt(m["acceptance_rate"]), fmt(m["target_calls_per_token"], 3), fmt(m["regret"], 1),
                 fmt(m["best_arm_ratio"]), fmt(m["mismatches"]), fmt(m["runs"])]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def target_checks(full: dict[str, dict[str, Any]]) -> list[str]:
    """The default policy's bars against its peers (the best single drafter, the per-domain oracle,
    the static router, transformers' assisted generation), where the compared methods were run."""
    def overall(method: str, key: str = "speedup") -> float | None:
        return full.get(method, {}).get(OVERALL, {}).get(key)

    default = overall("default")
    if default is None:
        return []
    speedups = {m: s for m in full if (s := overall(m)) is not None}
    fixed = {m: s for m, s in speedups.items() if m.startswith(FIXED)}
    peers = {m: s for m, s in speedups.items() if m.startswith("hf-assisted:") and "," not in m}
    checks: list[tuple[str, float, float, str]] = []
    if fixed:
        best = max(fixed, key=fixed.__getitem__)
        checks.append(("≥ 1.1× the best single drafter", default, 1.1 * fixed[best], best))
    oracle = overall(ORACLE)
    if oracle is not None:
        checks.append(("≥ 0.9× the per-domain oracle's speedup", default, 0.9 * oracle, ORACLE))
        default_mat, oracle_mat = overall("default", "mat"), overall(ORACLE, "mat")
        if default_mat is not None and oracle_mat is not None:
            checks.append(("MAT ≥ 0.95× the oracle's", default_mat, 0.95 * oracle_mat, ORACLE))
    router = overall("router")
    if router is not None:
        checks.append(("above the static router", default, router + 1e-12, "router"))
    if peers:
        best = max(peers, key=peers.__getitem__)
        checks.append(("≥ 1.2× transformers assisted (best drafter)", default, 1.2 * peers[best], best))
    return [f"| {name} | {value:.3f} | {bar:.3f} ({against}) | {'yes' if value >= bar else 'no'} |"
            for name, value, bar, against in checks]


def markdown(full: dict[str, dict[str, Any]], env: dict[str, Any]) -> str:
    config = env.get("config", {})
    parts = [
        "# draftwise bench",
        f"Target `{config.get('target')}`, drafters `{', '.join(config.get('drafters', []))}`, "
        f"max {config.get('max_new_tokens')} new tokens, temperature {config.get('temperature')}, "
        f"draft length {config.get('draft_len') or 'default'}, {config.get('repeats')} repeat(s), "
        f"{env.get('prompts', {}).get('count')} prompts; git {env.get('git', {}).get('commit', '?')[:10]}.",
        "## Speedup over `ar` (total tokens / total time)", paper_table(full, "speedup"),
        "## Speedup, Spec-Bench style (mean of per-prompt speeds)", paper_table(full, "speedup_mean_of_prompts"),
        "## Mean accepted tokens per target call (MAT)", paper_table(full, "mat"),
        "## Overall", overall_table(full),
    ]
    checks = target_checks(full)
    if checks:
        parts += ["## Targets (default policy)",
                  "| target | default | bar | met |\n|---|---:|---:|---|\n" + "\n".join(checks)]
    return "\n\n".join(parts) + "\n"


def write_csv(path: Path, full: dict[str, dict[str, Any]]) -> None:
    keys = SUMMARY_KEYS + EXTRA_KEYS
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(("method", "domain") + keys)
        for method, v in full.items():
            for domain, m in [(OVERALL, v[OVERALL]), *sorted(v["by_domain"].items())]:
                writer.writerow((method, domain) + tuple("" if m[k] is None else m[k] for k in keys))


def write_reports(out: Path, rows: Sequence[dict], methods: Sequence[str], env: dict[str, Any], greedy: bool,
                  plots: bool = True, coupled: bool = False) -> dict[str, dict[str, Any]]:
    """summary.json / .md / .csv and the plots; returns the full per-method metrics."""
    full = summarize_rows(rows, methods, greedy, coupled)
    (out / "summary.json").write_text(json.dumps(summary_json(full), indent=2))
    (out / "summary.md").write_text(markdown(full, env))
    write_csv(out / "summary.csv", full)
    if plots:
        write_plots(out, with_derived(rows, methods), full, methods, len(env.get("pool", [])) or None)
    return full


# ----------------------------------------------------------------------------- env.json


def git_info() -> dict[str, Any]:
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", "-C", str(here), *args], capture_output=True, text=True, timeout=10)
            return done.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD") or "unknown",
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_info() -> dict[str, Any]:
    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    # the lean drafters' LM-head dtype for float32 models follows the CPU ("auto"): results depend on it
    head = str(resolve_head_dtype(None, torch.float32)).replace("torch.", "")
    return {"model": model, "count": os.cpu_count(), "machine": platform.machine(), "system": platform.platform(),
            "python": platform.python_version(), "torch_capability": torch.backends.cpu.get_cpu_capability(),
            "drafter_head_dtype": head}


def environment(config: Any, methods: Sequence[str], prompts: Sequence[Any], router: dict[str, Any] | None,
                seed_rule: str, pool: Sequence[str] = (), target: Any = None) -> dict[str, Any]:
    """What a run's figures depend on; ``target``: the loaded target, whose measured costs on this
    machine (:mod:`draftwise.models.costs`) the decisions were priced on."""
    domains: dict[str, int] = defaultdict(int)
    for p in prompts:
        domains[p.domain] += 1
    return {
        "git": git_info(),
        "versions": versions(),
        "cpu": cpu_info(),
        "torch_threads_per_worker": config.threads,
        "torch_interop_threads": torch.get_num_interop_threads(),
        "seeds": {"run": config.seed, "per_generation": seed_rule, "dev_set_sample": config.seed,
                  "router": router["seed"] if router else None, "warmup": config.seed},
        "config": asdict(config),
        "methods": list(methods),
        "drafters": list(config.drafters),
        "pool": list(pool),
        "prompts": {"count": len(prompts), "by_domain": dict(domains)},
        "router": router,
        "costs": None if target is None else target_costs(target).summary(),
    }
