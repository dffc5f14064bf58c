"""Acceptance rate and MAT of every zoo drafter on every domain's held-out split (docs/zoo.md table).

    python benchmarks/zoo_acceptance.py --build BUILD --out results/zoo_acceptance.json
    python benchmarks/zoo_acceptance.py --build DIR --crosscheck math,sql --crosscheck-prompts 3

The table comes from draftwise.training.evaluate (exact greedy round structure from one teacher-forced
drafter pass, see its docstring). ``--crosscheck`` re-runs a few cells through the engine
(``Generator`` with ``policy="fixed:NAME"``) and reports whether tokens and rounds agree.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import subprocess
import sys
from pathlib import Path

import torch
import transformers

from draftwise.training.corpus import DOMAINS, read_split
from draftwise.training.evaluate import (
    drafter_stats,
    evaluate_zoo,
    format_table,
    load_fp32,
    specialist_bar,
    target_continuations,
)
from draftwise.training.tokenizer import encode_prompts
from draftwise.zoo.load import resolve_zoo_name, shipped_models_dir

# defaults, one line each
N_PROMPTS = 100  # held-out prompts per domain (all of each dev split)
MAX_NEW_TOKENS = 96  # target tokens decoded per prompt
DRAFT_LENGTH = 5  # greedy draft length (HedgeSpec Table 1 uses a fixed draft length)
THREADS = 1  # torch threads (the machine is shared)


def git_hash() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def crosscheck(build: Path, models: Path, domain: str, drafter: str, n: int, max_new: int, k: int) -> dict:
    """One cell through the engine: same tokens as the target's greedy decode, same rounds?"""
    from draftwise import Generator

    target_dir = resolve_zoo_name("zoo:target", models)
    generator = Generator.from_pretrained(
        target_dir, drafters=[resolve_zoo_name(f"zoo:{drafter}", models)], policy=f"fixed:{drafter}", draft_len=k
    )
    tokenizer = generator.tokenizer
    prompts = encode_prompts(tokenizer, read_split(build / "corpus" / "dev" / f"{domain}.jsonl")[:n])
    reference = target_continuations(load_fp32(target_dir), prompts, max_new, tokenizer.eos_token_id,
                                     tokenizer.pad_token_id)
    ours = drafter_stats(load_fp32(resolve_zoo_name(f"zoo:{drafter}", models)), prompts, reference, k)
    engine_tokens = engine_rounds = 0
    same_tokens = True
    for prompt, expected in zip(prompts, reference):
        result = generator.generate(list(prompt), max_new_tokens=max_new)
        same_tokens &= list(result.token_ids)[: len(expected)] == expected
        engine_tokens += result.stats.new_tokens
        engine_rounds += result.stats.rounds
    return {
        "domain": domain, "drafter": drafter, "prompts": len(prompts), "same_tokens": same_tokens,
        "evaluate_mat": ours.mat, "engine_mat": engine_tokens / max(engine_rounds, 1),
        "evaluate_rounds": ours.rounds, "engine_rounds": engine_rounds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", required=True, help="zoo build folder (for its held-out splits)")
    parser.add_argument("--models", default=str(shipped_models_dir()), help="zoo models folder")
    parser.add_argument("--split", default="dev", choices=("dev", "test"))
    parser.add_argument("--prompts", type=int, default=N_PROMPTS)
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    parser.add_argument("--draft-length", type=int, default=DRAFT_LENGTH)
    parser.add_argument("--crosscheck", default="", help="comma-separated domains to re-run through the engine")
    parser.add_argument("--crosscheck-prompts", type=int, default=3)
    parser.add_argument("--out", help="write the JSON result here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(THREADS)
    build, models = Path(args.build), Path(args.models)

    result = evaluate_zoo(build, args.split, args.prompts, args.max_new_tokens, args.draft_length, models, DOMAINS,
                          progress=True)
    result["bar"] = specialist_bar(result)
    result["crosscheck"] = [
        crosscheck(build, models, d, d, args.crosscheck_prompts, args.max_new_tokens, args.draft_length)
        for d in filter(None, args.crosscheck.split(","))
    ]
    result["provenance"] = {
        "git": git_hash(), "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "threads": THREADS,
        "zoo_seed": json.loads((models / "zoo.json").read_text())["build"].get("seed"),
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    print(format_table(result))
    for check in result["crosscheck"]:
        print(json.dumps(check))
    return 0


if __name__ == "__main__":
    sys.exit(main())
