"""The target's cost curve in every numerics: one forward over k new tokens after a KV cache, × the
one-token forward of the same numerics, and whether its rows are bit-identical to k one-token
forwards (what makes speculation token-exact). Also plain decoding's tokens per second, end to end
through the engine, on the same prompts in every numerics.

    python benchmarks/target_numerics.py                          # smollm2, every numerics, 1 thread
    python benchmarks/target_numerics.py --target zoo:target --numerics int4,float32

Modes are interleaved (each repeat times every mode in turn) so that a drift of the machine lands on
all of them alike; medians of the repeats.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from draftwise import Generator
from draftwise.models.cached_lm import CachedLM
from draftwise.models.loading import rows_are_independent
from draftwise.models.numerics_modes import NUMERICS_MODES

CONTEXT = 200
TOKENS = (1, 2, 4, 5, 8, 9, 16, 17)
PROMPTS = ["Write a Python function that returns the square of a number.",
           "Translate to French: The weather is nice today and we are going to the beach.",
           "Explain in two sentences why the sky is blue."]


def forward_ms(lm: CachedLM, context: list[int], k: int, generator: torch.Generator, vocab: int) -> float:
    new = torch.randint(0, vocab, (k,), generator=generator).tolist()
    start = time.perf_counter()
    lm.logits(context + new, k)
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--numerics", default=",".join(NUMERICS_MODES), help="comma-separated (default: all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=64, help="plain decoding per prompt")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    modes = args.numerics.split(",")
    gens = {m: Generator.from_pretrained(args.target, [], policy="fixed:none", numerics=m) for m in modes}
    vocab = int(next(iter(gens.values())).target.vocab_size)
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, vocab, (CONTEXT,), generator=generator).tolist()
    caches = {m: CachedLM(g.model) for m, g in gens.items()}
    for lm in caches.values():
        lm.logits(context)
        for k in TOKENS:  # warm-up: first uses of each shape
            forward_ms(lm, context, k, generator, vocab)
    times: dict[tuple[str, int], list[float]] = {(m, k): [] for m in modes for k in TOKENS}
    for _ in range(args.repeats):
        for k in TOKENS:
            for m in modes:
                times[m, k].append(forward_ms(caches[m], context, k, generator, vocab))
    plain: dict[str, list[float]] = {m: [] for m in modes}
    for gen in gens.values():
        gen.generate(PROMPTS[0], max_new_tokens=8)  # warm-up
    for prompt in PROMPTS:
        for m, gen in gens.items():
            result = gen.generate(prompt, max_new_tokens=args.max_new_tokens, ignore_eos=True)
            plain[m].append(result.stats.tokens_per_s)
    print(f"target {args.target}, {args.threads} thread(s), KV cache at {CONTEXT} tokens, "
          f"median of {args.repeats}")
    print("| numerics | 1 token (ms) | " + " | ".join(f"{k}" for k in TOKENS[1:]) + " | rows exact (k=9) | "
          "plain tok/s |")
    print("|---|---:|" + "---:|" * (len(TOKENS) - 1) + "---|---:|")
    for m in modes:
        one = statistics.median(times[m, 1])
        ratios = " | ".join(f"{statistics.median(times[m, k]) / one:.2f}×" for k in TOKENS[1:])
        exact = rows_are_independent(gens[m].model, context=CONTEXT, new=9)
        print(f"| {m} | {one:.1f} | {ratios} | {'yes' if exact else 'no'} | {statistics.median(plain[m]):.1f} |")


if __name__ == "__main__":
    main()
