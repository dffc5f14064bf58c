"""Long prompts: the target's prefill time and peak memory, and its decoding step after them, in
each numerics, and llama.cpp's on the same GGUF file (``llama-cpp``: the optional extra). Each
(numerics, length) runs in a process of its own (peak memory is per process), numerics interleaved
within each repeat; medians of the repeats.

    python benchmarks/long_prompts.py                                  # smollm2: int4, native, llama.cpp; 2 threads
    python benchmarks/long_prompts.py --threads 1 --lengths 2000,8000 --numerics int4,float32,native
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time


def one_run(target: str, numerics: str, length: int, threads: int, steps: int) -> dict[str, float]:
    """In this process: load, prefill ``length`` random tokens, then ``steps`` one-token forwards."""
    if numerics == "llama-cpp":
        return llama_cpp_run(target, length, threads, steps)
    import torch

    from draftwise.models.cached_lm import CachedLM
    from draftwise.models.loading import LoadOptions, load_target

    torch.set_num_threads(threads)
    model, _, _ = load_target(target, LoadOptions(numerics=numerics))
    loaded_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    generator = torch.Generator().manual_seed(length)
    tokens = torch.randint(0, int(model.config.vocab_size), (length + steps,), generator=generator).tolist()
    lm = CachedLM(model)
    start = time.perf_counter()
    lm.logits(tokens[:length])
    prefill_s = time.perf_counter() - start
    step_s = []
    for i in range(steps):
        start = time.perf_counter()
        lm.logits(tokens[: length + i + 1])
        step_s.append(time.perf_counter() - start)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"prefill_s": prefill_s, "prefill_tok_s": length / prefill_s, "step_ms": 1000 * statistics.median(step_s),
            "peak_mb": peak_mb, "loaded_mb": loaded_mb}


def llama_cpp_run(target: str, length: int, threads: int, steps: int) -> dict[str, float]:
    """:func:`one_run` for llama.cpp on the target's GGUF file (its own default batch of 512 tokens)."""
    import llama_cpp
    import numpy as np

    from draftwise.bench.methods import target_gguf

    llm = llama_cpp.Llama(model_path=target_gguf(target), n_ctx=length + steps + 8, n_threads=threads,
                          n_threads_batch=threads, verbose=False, seed=0)
    loaded_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tokens = np.random.default_rng(length).integers(0, llm.n_vocab(), length + steps).tolist()
    start = time.perf_counter()
    llm.eval(tokens[:length])
    prefill_s = time.perf_counter() - start
    step_s = []
    for token in tokens[length:]:
        start = time.perf_counter()
        llm.eval([token])
        step_s.append(time.perf_counter() - start)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"prefill_s": prefill_s, "prefill_tok_s": length / prefill_s, "step_ms": 1000 * statistics.median(step_s),
            "peak_mb": peak_mb, "loaded_mb": loaded_mb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--numerics", default="int4,native,llama-cpp", help="comma-separated")
    parser.add_argument("--lengths", default="200,2000,5800,8000", help="prompt tokens, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16, help="one-token forwards timed after the prompt")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # NUMERICS:LENGTH, run in this process
    args = parser.parse_args()
    if args.one:
        numerics, length = args.one.split(":")
        print(json.dumps(one_run(args.target, numerics, int(length), args.threads, args.steps)))
        return
    modes, lengths = args.numerics.split(","), [int(n) for n in args.lengths.split(",")]
    runs: dict[tuple[str, int], list[dict[str, float]]] = {(m, n): [] for m in modes for n in lengths}
    for _ in range(args.repeats):
        for length in lengths:
            for mode in modes:
                out = subprocess.run([sys.executable, __file__, "--target", args.target, "--threads", str(args.threads),
                                      "--steps", str(args.steps), "--one", f"{mode}:{length}"],
                                     check=True, capture_output=True, text=True).stdout
                runs[mode, length].append(json.loads(out.strip().splitlines()[-1]))
    print(f"{args.target}, {args.threads} thread(s), medians of {args.repeats}")
    print("| prompt tokens | numerics | prefill s | prefill tok/s | decode ms/token after it | peak RSS MB |")
    print("|---:|---|---:|---:|---:|---:|")
    for length in lengths:
        for mode in modes:
            got = runs[mode, length]

            def med(key: str, got: list[dict[str, float]] = got) -> float:
                return statistics.median(r[key] for r in got)

            print(f"| {length:,} | {mode} | {med('prefill_s'):.2f} | {med('prefill_tok_s'):.0f} | "
                  f"{med('step_ms'):.1f} | {med('peak_mb'):.0f} |")


if __name__ == "__main__":
    main()
