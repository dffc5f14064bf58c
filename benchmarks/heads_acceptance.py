"""Greedy MAT and acceptance of white-box heads (and any other drafters) per domain, through the engine.

    python benchmarks/heads_acceptance.py --build BUILD --heads HEADS \
        --drafter zoo:generalist --prompts 12 --out heads_acceptance.json

(BUILD: a zoo build folder, ``draftwise zoo build``; HEADS: a folder of head folders.)

EAGLE drafts depend on the head's own predicted features, not only on tokens, so the teacher-forced
shortcut of ``draftwise.training.evaluate`` does not apply: every cell runs ``Generator`` with
``policy="fixed:0"`` (greedy, one drafter, fixed draft length) on the build's held-out dev prompts.
Every generation is also checked token-exact against the plain target run (losslessness).
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers

from draftwise import Generator
from draftwise.drafters import build_drafters
from draftwise.models.loading import LoadOptions, load_causal_lm
from draftwise.training.corpus import DOMAINS, read_split
from draftwise.training.tokenizer import encode_prompts

# defaults, one line each
N_PROMPTS = 12  # dev prompts per domain
MAX_NEW_TOKENS = 96  # tokens generated per prompt
DRAFT_LENGTH = 5  # arm draft length (as the zoo's table)
THREADS = 1  # torch threads (the machine is shared)


def head_specs(heads: Path | None, tree: str) -> list[str]:
    """``eagle:head=…`` / ``medusa:head=…`` for every head folder, with tree options appended."""
    if heads is None:
        return []
    specs = []
    for folder in sorted(p for p in heads.iterdir() if (p / "config.json").exists()):
        kind = json.loads((folder / "config.json").read_text()).get("draftwise_head")
        if kind:
            specs.append(f"{kind}:head={folder}" + (f",{tree}" if tree else ""))
    return specs


def run_cell(gen: Generator, prompts: list[list[int]], reference: list[list[int]], max_new: int) -> dict:
    tokens = rounds = accepted = drafted = 0
    draft_s = 0.0
    exact = True
    start = time.perf_counter()
    for prompt, ref in zip(prompts, reference):
        out = gen.generate(prompt, max_new_tokens=max_new)
        exact &= out.token_ids == ref
        tokens += out.stats.new_tokens
        rounds += out.stats.rounds
        accepted += out.stats.accepted
        drafted += out.stats.drafted
        draft_s += sum(r.draft_s for r in out.trace)
    return {"mat": tokens / max(rounds, 1), "acceptance": accepted / max(drafted, 1), "tokens": tokens,
            "rounds": rounds, "wall_s": time.perf_counter() - start, "token_exact": exact,
            "tokens_per_s": tokens / max(time.perf_counter() - start, 1e-9),
            "draft_ms_per_drafted_token": 1000 * draft_s / max(drafted, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", required=True, help="zoo build folder (its corpus/dev prompts)")
    parser.add_argument("--target", default="", help="target (default: BUILD/models/target)")
    parser.add_argument("--heads", help="folder of head checkpoints (every sub-folder is evaluated)")
    parser.add_argument("--drafter", action="append", default=[], help="more drafter specs (repeatable)")
    parser.add_argument("--tree", default="", help="tree options for the heads, e.g. tree=dynamic,topk=4,budget=16")
    parser.add_argument("--domains", default=",".join(DOMAINS))
    parser.add_argument("--prompts", type=int, default=N_PROMPTS)
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    parser.add_argument("--draft-length", type=int, default=DRAFT_LENGTH)
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--out", help="write the result (JSON) here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    build = Path(args.build)
    target, tokenizer = load_causal_lm(args.target or str(build / "models" / "target"), LoadOptions())
    specs = head_specs(Path(args.heads) if args.heads else None, args.tree) + args.drafter
    drafters = build_drafters(specs, target, tokenizer, LoadOptions())
    plain = Generator(target, tokenizer, [], policy="ucb")
    result: dict = {"config": {**vars(args), "specs": specs, "git": _git_hash(), "python": platform.python_version(),
                               "torch": torch.__version__, "transformers": transformers.__version__}, "cells": {}}
    for domain in args.domains.split(","):
        prompts = encode_prompts(tokenizer, read_split(build / "corpus" / "dev" / f"{domain}.jsonl")[: args.prompts])
        reference = [plain.generate(p, max_new_tokens=args.max_new_tokens).token_ids for p in prompts]
        for drafter in drafters:
            gen = Generator(target, tokenizer, [drafter], policy="fixed:0", draft_len=args.draft_length)
            cell = run_cell(gen, prompts, reference, args.max_new_tokens)
            result["cells"].setdefault(drafter.name, {})[domain] = cell
            print(f"{drafter.name:<22} {domain:<14} MAT {cell['mat']:.2f} acc {cell['acceptance']:.2f}"
                  f" tok/s {cell['tokens_per_s']:.0f} draft ms/token {cell['draft_ms_per_drafted_token']:.2f}"
                  f" exact {cell['token_exact']}", file=sys.stderr)
    print(format_table(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


def format_table(result: dict) -> str:
    """Markdown: one row per drafter, MAT (acceptance) per domain, and the mean MAT."""
    domains = sorted({d for cells in result["cells"].values() for d in cells}, key=DOMAINS.index)
    lines = ["| drafter | " + " | ".join(domains) + " | mean MAT |", "|---" * (len(domains) + 2) + "|"]
    for name, cells in result["cells"].items():
        row = [f"{cells[d]['mat']:.2f} ({cells[d]['acceptance']:.2f})" for d in domains]
        mean = sum(cells[d]["mat"] for d in domains) / len(domains)
        lines.append(f"| {name} | " + " | ".join(row) + f" | {mean:.2f} |")
    return "\n".join(lines)


def _git_hash() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
