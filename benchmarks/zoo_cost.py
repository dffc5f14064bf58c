"""Per-token forward cost of the shipped zoo models on this CPU (KV cache, batch 1).

    python benchmarks/zoo_cost.py --threads 2

Prints milliseconds per single-token forward (after a 64-token prefill) for the target and one
drafter, and their ratio (the zoo's design asks for a target ≥ 5× a drafter: docs/zoo.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from draftwise.zoo.load import resolve_zoo_name

PREFILL = 64  # prompt tokens before timing
STEPS = 64  # timed single-token forwards per repeat
REPEATS = 5  # best-of repeats (the machine is shared)


@torch.no_grad()
def ms_per_token(path: str) -> float:
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    times = []
    for _ in range(REPEATS + 1):  # the first repeat is warm-up
        cache = DynamicCache(config=model.config)
        ids = torch.arange(10, 10 + PREFILL)[None]
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        started = time.perf_counter()
        for _ in range(STEPS):
            out = model(input_ids=token, past_key_values=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
        times.append((time.perf_counter() - started) * 1000 / STEPS)
    return min(times[1:]) if len(times) > 1 else statistics.mean(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drafter", default="zoo:code")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    target = ms_per_token(resolve_zoo_name("zoo:target"))
    drafter = ms_per_token(resolve_zoo_name(args.drafter))
    print(json.dumps({"threads": args.threads, "target_ms": round(target, 2), "drafter_ms": round(drafter, 2),
                      "ratio": round(target / drafter, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
