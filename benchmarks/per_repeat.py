"""Speedup over ``ar`` per method and per repeat of ``draftwise bench`` result folders.

    python benchmarks/per_repeat.py runs/A runs/B

Why: a second repeat is not a fresh measurement for every method. The suffix drafter keeps a store
of earlier answers, so on repeat 2 it holds repeat 1's answers to the very same prompts, and a
learner that keeps state across queries starts warm. Comparing first repeats separates that out.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path


def speedups(folder: Path) -> dict[str, list[float]]:
    """method → [tokens/s ÷ ar's tokens/s, per repeat]."""
    tokens: Counter[tuple[str, int]] = Counter()
    seconds: Counter[tuple[str, int]] = Counter()
    for line in (folder / "results.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            tokens[row["method"], row["repeat"]] += row["new_tokens"]
            seconds[row["method"], row["repeat"]] += row["wall_s"]
    repeats = sorted({r for _, r in tokens})
    methods = sorted({m for m, _ in tokens})

    def rate(method: str, repeat: int) -> float:
        return tokens[method, repeat] / seconds[method, repeat] if seconds[method, repeat] else 0.0

    return {m: [rate(m, r) / rate("ar", r) if rate("ar", r) else 0.0 for r in repeats] for m in methods}


def main(folders: list[str]) -> int:
    for folder in folders:
        print(folder)
        for method, values in speedups(Path(folder)).items():
            print(f"  {method:28s} " + " ".join(f"{v:.2f}" for v in values))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
