"""``draftwise bench``: every method on real prompts, side by side with transformers; tables and plots.

Exit status: 0 when every greedy output equals ``ar``'s, 1 when any differs (a losslessness
failure: the rows and reports are still written), 2 for bad input, 130 after Ctrl-C (finished
rows kept; rerunning resumes).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from draftwise.bench.config import DEFAULT_METHODS, DEFAULT_POOL, DEFAULT_TARGET, BenchConfig
from draftwise.bench.datasets import PROMPT_SETS, ZOO_PER_DOMAIN
from draftwise.cli.generate import add_sampling_option
from draftwise.errors import DraftwiseError
from draftwise.models.defaults import default_drafters
from draftwise.models.numerics_modes import AUTO, NUMERICS_CHOICES, NUMERICS_HELP

MISMATCH_EXIT = 1
INTERRUPTED_EXIT = 130  # 128 + SIGINT, as for every Ctrl-C of the CLI


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark methods on prompt sets: speedup, MAT, tables and plots",
        description="Run every prompt × method × repeat, append one row per run to OUT/results.jsonl (rerunning "
        "on the same OUT resumes), then write summary.json / .md / .csv, env.json and PNG plots. Speedups are "
        "against 'ar' (plain decoding) on the same prompts in the same run. Greedy outputs must equal ar's: any "
        "mismatch makes the command exit 1.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="methods: ar, hf-ar, default, fixed:NAME, fixed:NAME@L, fixed:*, random, any policy or preset (ucb, "
        "ucb:beta=0.1, hedgespec, …; POLICY@K = first K drafters), policies:*, router, oracle, hf-assisted:NAME "
        "(,schedule=constant|heuristic|default), hf-assisted:*, hf-pld. See docs/bench.md.",
    )
    p.add_argument("--out", required=True, help="output folder (created; an existing one is resumed)")
    p.add_argument("--data", action="append", default=[], metavar="FILE|SET",
                   help="prompts (repeatable): a JSONL file of {prompt, domain}, Spec-Bench/MT-Bench {question_id, "
                   "category, turns} or Self-Instruct {id, instruction, instances} lines, or a named set: "
                   f"{', '.join(PROMPT_SETS)} (self_instruct: the shared datasets' seed tasks, via "
                   "$DRAFTWISE_DATA or ../shared/data; zoo:SPLIT: the zoo corpus's held-out split, see --zoo-corpus); "
                   "default: zoo:dev")
    p.add_argument("--turns", choices=("first", "all"), default="first",
                   help="MT-Bench style files: the first turn only (default) or one prompt per turn")
    p.add_argument("--methods", action="append", default=None, metavar="A,B,...",
                   help=f"methods to compare (repeatable; ar is always added); default: {','.join(DEFAULT_METHODS)}")
    p.add_argument("--max-new-tokens", type=int, default=128, help="most new tokens per prompt (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default; outputs checked against ar)")
    p.add_argument("--top-k", type=int, default=None, help="sampling: top-k")
    p.add_argument("--top-p", type=float, default=None, help="sampling: nucleus mass")
    add_sampling_option(p)
    p.add_argument("--repeats", type=int, default=1, help="timed repeats of every run (mean ± std; default 1)")
    p.add_argument("--workers", type=int, default=1,
                   help="parallel processes, prompts split among them, each timing its own ar (default 1)")
    p.add_argument("--ray", metavar="ADDRESS", default=None,
                   help="run on a Ray cluster (ADDRESS, 'auto' or 'local'); needs pip install 'draftwise[ray]'")
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"target model (default {DEFAULT_TARGET})")
    p.add_argument("--drafter", action="append", default=None, metavar="SPEC",
                   help=f"drafter pool (repeatable; default with smollm2 or zoo:target {' '.join(DEFAULT_POOL)}, "
                   "else none)")
    p.add_argument("--draft-len", type=int, default=None,
                   help="draft tokens per round, peers included (default: the library's 4; presets keep their own)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random choice (default 0)")
    p.add_argument("--per-domain", type=int, default=None, metavar="N",
                   help=f"prompts kept per domain of each --data source: the first N of a file, N sampled with "
                   f"--seed from a zoo split (default: all of a file; {ZOO_PER_DOMAIN} of a zoo split)")
    p.add_argument("--zoo-corpus", default=None, metavar="DIR",
                   help="zoo build folder or its corpus folder (held-out dev/test splits, router training split); "
                   "default $DRAFTWISE_ZOO_CORPUS, then a corpus shipped with the zoo")
    p.add_argument("--router-train", default=None, metavar="FILE",
                   help="router training JSONL: prompt + drafter (or domain) per line (default: the router "
                   "shipped with the zoo, else one trained on the zoo corpus's train split)")
    p.add_argument("--warmup-tokens", type=int, default=16,
                   help="length of each method's untimed warm-up run (0: none)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker (default 1)")
    p.add_argument("--numerics", default=AUTO, choices=NUMERICS_CHOICES, help=NUMERICS_HELP)
    p.add_argument("--dtype", default="float32",
                   help="what drafters load in, and the target under --numerics native (default float32)")
    p.add_argument("--device", default="cpu", help="where every model runs: cpu (default), cuda, cuda:N, mps or xpu")
    p.add_argument("--batch-size", default=None, metavar="B[,B...]",
                   help="batched rounds: run every method over all prompts B at a time (continuous batching) and "
                   "report output tokens/s against ar, batched plain decoding at the same B (methods: ar, hf-ar, "
                   "default, fixed:NAME[@L], length:K, banditspec-length, any policy); results in "
                   "OUT/batch-summary.md")
    p.add_argument("--length-drafter", default="pld", metavar="NAME",
                   help="with --batch-size: the drafter of length:K and banditspec-length (default pld)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    # the engine loads torch and transformers (seconds): imported when the command runs, not for its parser
    from draftwise.bench.methods import split_methods

    methods = [m for text in (args.methods or [",".join(DEFAULT_METHODS)]) for m in split_methods(text)]
    return BenchConfig(
        out=args.out, data=tuple(args.data), methods=tuple(methods), target=args.target,
        drafters=tuple(args.drafter if args.drafter is not None else default_drafters(args.target)),
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        sampling=args.sampling, repeats=args.repeats, draft_len=args.draft_len, seed=args.seed, turns=args.turns,
        per_domain=args.per_domain,
        zoo_corpus=args.zoo_corpus, router_train=args.router_train, warmup_tokens=args.warmup_tokens,
        workers=args.workers, ray=args.ray, threads=args.threads, dtype=args.dtype, numerics=args.numerics,
        device=args.device,
        progress=not args.quiet,
    )


def run(args: argparse.Namespace) -> int:
    # the engine loads torch and transformers (seconds): imported when the command runs, not for its parser
    import torch

    from draftwise.bench.report import total_mismatches, write_reports
    from draftwise.bench.runner import RESULTS, read_rows, run_bench

    config = config_from_args(args)
    torch.set_num_threads(config.threads)
    out = Path(config.out)
    if args.batch_size is not None:
        return run_batched_cli(config, args)
    try:
        result = run_bench(config)
    except KeyboardInterrupt:
        # One Ctrl-C stops the whole bench: finished rows are on disk, the cut-short run is not.
        kept = len(read_rows(out / RESULTS)) if (out / RESULTS).exists() else 0
        print(f"interrupted: {kept} finished rows kept in {out / RESULTS}; rerun the same command to resume",
              file=sys.stderr)
        return INTERRUPTED_EXIT
    full = write_reports(out, result.rows, result.methods, result.env, greedy=config.temperature == 0,
                         plots=not args.no_plots, coupled=config.sampling == "coupled")
    print((out / "summary.md").read_text())
    print(f"{result.new_rows} new rows, {len(result.rows)} in total; results in {out}", file=sys.stderr)
    mismatches = total_mismatches(full)
    if mismatches:
        bad = [m for m, v in full.items() if v["overall"]["mismatches"]]
        what = "greedy" if config.temperature == 0 else "coupled-sampling"
        print(f"draftwise bench: error: {mismatches} output(s) differ from ar's {what} output "
              f"(methods: {', '.join(bad)}); see {out / 'results.jsonl'}", file=sys.stderr)
        return MISMATCH_EXIT
    return 0


def parse_sizes(text: str) -> list[int]:
    """``"1,4,16"`` → [1, 4, 16] (one clear error otherwise)."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise DraftwiseError(f"--batch-size takes batch sizes ≥ 1 separated by commas (e.g. 1,4,16), got {text!r}")
    return sizes


def run_batched_cli(config: BenchConfig, args: argparse.Namespace) -> int:
    # the engine loads torch and transformers (seconds): imported when the command runs, not for its parser
    from draftwise.bench.batched import SUMMARY, run_batched

    sizes = parse_sizes(args.batch_size)
    methods = config.methods if args.methods else ("ar", "hf-ar", "default", "length:2", "length:4", "length:8",
                                                   "banditspec-length")
    try:
        summary = run_batched(replace(config, methods=tuple(methods)), sizes, args.length_drafter)
    except KeyboardInterrupt:
        print(f"interrupted: finished rows kept in {Path(config.out)}; rerun the same command to resume",
              file=sys.stderr)
        return INTERRUPTED_EXIT
    print((Path(config.out) / f"{SUMMARY}.md").read_text())
    mismatches = sum(v["mismatches"] for table in summary.values() for v in table.values())
    if mismatches:
        print(f"draftwise bench: error: {mismatches} output(s) differ from ar's greedy output beyond near-ties",
              file=sys.stderr)
        return MISMATCH_EXIT
    return 0
