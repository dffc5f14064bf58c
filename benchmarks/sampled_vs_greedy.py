"""What sampling costs a batch of plain decoding: `ar` sampled (T 0.7) ÷ `ar` greedy, same prompts,
same process, batch sizes 8 and 32, 3 repeats after a warm-up (the coupled noise is a hash drawn
for a whole round at once; before 2026-11-26 it was drawn per lane and position).

    python benchmarks/sampled_vs_greedy.py ../shared/data/self_instruct/seed_tasks.jsonl

Prints tokens/s and the bookkeeping share per (B, temperature) and the ratio per repeat. The ratio
is within one process, so a drifting machine moves both sides; to compare two checkouts, run the
script under each (``PYTHONPATH=CHECKOUT/src``) in turn, twice.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from draftwise.api import Generator

SIZES = (8, 32)
TEMPERATURE = 0.7


def run(gen: Generator, prompts: list[list[int]], size: int, temperature: float, max_new: int) -> tuple[float, float]:
    """(tokens/s, bookkeeping share of the wall) of one pass over ``prompts`` at batch ``size``."""
    session = gen.batch_session(size)
    handles = [session.add(p, max_new_tokens=max_new, temperature=temperature, seed=i, ignore_eos=True)
               for i, p in enumerate(prompts)]
    start = time.perf_counter()
    session.run()
    wall = time.perf_counter() - start
    tokens = sum(len(h.result.token_ids) for h in handles if h.result is not None)
    return tokens / wall, session.engine.timing.bookkeeping_s / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("prompts", help="JSONL with an 'instruction' or 'prompt' field (self_instruct's seed tasks)")
    parser.add_argument("--count", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    gen = Generator.from_pretrained("zoo:target", [], policy="fixed", seed=0)
    with open(args.prompts, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle][: args.count]
    prompts = [gen.encode(r.get("prompt") or r["instruction"]) for r in rows]
    for size in SIZES:
        results: dict[float, list[tuple[float, float]]] = {0.0: [], TEMPERATURE: []}
        for repeat in range(args.repeats + 1):  # the first is a warm-up
            for temperature in results:
                measured = run(gen, prompts, size, temperature, args.max_new_tokens)
                if repeat:
                    results[temperature].append(measured)
        for temperature, values in results.items():
            print(f"B={size} T={temperature}: {statistics.median(v[0] for v in values):.1f} tokens/s, "
                  f"bookkeeping {100 * statistics.median(v[1] for v in values):.1f} %")
        ratios = [s[0] / g[0] for s, g in zip(results[TEMPERATURE], results[0.0])]
        print(f"B={size}: sampled / greedy = {statistics.median(ratios):.3f} ({', '.join(f'{r:.3f}' for r in ratios)})")


if __name__ == "__main__":
    main()
