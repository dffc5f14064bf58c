"""Rows derived from the raw ones: (prompt, repeat) pairs, the per-domain oracle, the best single drafter.

Shared by the summaries (:mod:`draftwise.bench.report`) and the plots (:mod:`draftwise.bench.plots`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence

from draftwise.bench.methods import BASELINE

ORACLE = "oracle"
OVERALL = "overall"
FIXED = "fixed:"


def pair(row: dict) -> tuple[str, int]:
    return row["prompt_id"], row["repeat"]


def speed(rows: Iterable[dict]) -> float:
    rows = list(rows)
    seconds = sum(r["wall_s"] for r in rows)
    return sum(r["new_tokens"] for r in rows) / seconds if seconds > 0 else 0.0


def oracle_rows(rows: Sequence[dict]) -> list[dict]:
    """Per domain, the rows of the single drafter with the highest tokens/s there, relabelled ``oracle``."""
    by_domain: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["method"].startswith(FIXED):
            by_domain[r["domain"]][r["method"]].append(r)
    out = []
    for methods in by_domain.values():
        best = max(sorted(methods), key=lambda m: speed(methods[m]))
        out += [{**r, "method": ORACLE, "key": f"{r['prompt_id']}|{ORACLE}|{r['repeat']}", "oracle_of": best}
                for r in methods[best]]
    return out


def with_derived(rows: Sequence[dict], methods: Sequence[str]) -> list[dict]:
    rows = [r for r in rows if r["method"] != ORACLE]
    return rows + (oracle_rows(rows) if ORACLE in methods else [])


def mismatched_keys(rows: Sequence[dict]) -> set[str]:
    """Keys of rows whose output differs from ``ar`` on the same prompt and repeat."""
    reference = {pair(r): r["token_ids"] for r in rows if r["method"] == BASELINE}
    return {r["key"] for r in rows if pair(r) in reference and r["token_ids"] != reference[pair(r)]}


def best_fixed(rows: Sequence[dict]) -> dict[tuple[str, int], tuple[str, int]]:
    """(prompt, repeat) → (best single drafter's name, its target calls) in hindsight."""
    best: dict[tuple[str, int], tuple[str, int]] = {}
    for r in sorted(rows, key=lambda r: r["method"]):
        if r["method"].startswith(FIXED) and r.get("target_calls") is not None:
            calls = r["target_calls"]
            if pair(r) not in best or calls < best[pair(r)][1]:
                best[pair(r)] = (r["method"][len(FIXED):], calls)
    return best


def played_best(arm: str, best: str) -> bool:
    # arms may carry a draft length and a stopping rule (``code@6+svip``): the drafter comes first
    return arm == best or re.split(r"[@+]", arm, maxsplit=1)[0] == best
