"""The real target's drafter zoo: greedy acceptance per domain on the dev split, and each drafter's
cost per drafted token in the engine's loop against the target's cost per token (docs/zoo.md).

    python benchmarks/real_zoo.py --build BUILD --out runs/real-zoo/zoo.json

Acceptance comes from draftwise.training.evaluate (the exact greedy round structure from one
teacher-forced drafter pass along the target's own greedy answer; draft length 5). Costs come
from the engine's round records: a ``fixed`` arm per drafter at draft length 4 on a few dev
prompts, draft seconds per drafted token (on the drafter bank, as the engine runs it), against
plain decoding's seconds per target forward of one token.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import time
from pathlib import Path

import torch
from common import ANSWER_TOKENS, DRAFT_LENGTH, dev_answers  # benchmarks/common.py

# defaults, one line each
PROMPTS = 12  # dev prompts per domain for acceptance
COST_PROMPTS = 3  # dev prompts per drafter for the in-loop cost
COST_TOKENS = 64
THREADS = 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True, help="the distill build folder (its corpus' dev split)")
    parser.add_argument("--out", required=True, help="JSON result file")
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--prompts", type=int, default=PROMPTS)
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--drafter", action="append", default=[], metavar="SPEC",
                        help="measure these drafters (specs: a folder, eagle:head=FOLDER, zoo:NAME; repeatable) "
                             "instead of the zoo's for the target")
    parser.add_argument("--no-cost", action="store_true", help="acceptance only (no timed runs)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)

    from draftwise import Generator
    from draftwise.drafters import build_drafters
    from draftwise.models.loading import LoadOptions
    from draftwise.training.evaluate import drafter_stats, head_stats
    from draftwise.zoo import zoo_drafter_names, zoo_head_names

    names = args.drafter or [f"zoo:{n}" for n in zoo_drafter_names(target=args.target)]
    names += [] if args.drafter else [f"zoo:{n}" for n in zoo_head_names(target=args.target)]
    plain = Generator.from_pretrained(args.target, [], policy="fixed:none")
    target, tokenizer = plain.target.model, plain.tokenizer
    pool = build_drafters(names, target, tokenizer, LoadOptions())
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    result: dict = {"target": args.target, "drafters": names, "draft_length": DRAFT_LENGTH, "max_new": ANSWER_TOKENS,
                    "prompts_per_domain": args.prompts, "machine": platform.processor() or platform.machine(),
                    "threads": args.threads, "date": time.strftime("%Y-%m-%d"), "acceptance": {}, "cost_ms": {}}
    dev = dev_answers(plain, args.build, args.prompts, out_path.parent)
    for domain, (_, prompts, conts) in dev.items():
        row = {}
        for drafter in pool:
            stats = (head_stats(drafter, target, prompts, conts, DRAFT_LENGTH) if drafter.reads_target_hidden
                     else drafter_stats(drafter.model, prompts, conts, DRAFT_LENGTH))
            row[drafter.name] = {"mat": round(stats.mat, 3), "acceptance": round(stats.acceptance, 3),
                                 "first": round(stats.first_acceptance, 3)}
        result["acceptance"][domain] = row
        logging.info("%s: %s", domain, {k: v["mat"] for k, v in row.items()})
    if args.no_cost:
        out_path.write_text(json.dumps(result, indent=2) + "\n")
        return
    cost_prompts = [e.instruction for d in ("code", "math", "qa") for e in dev[d][0][:1]][:COST_PROMPTS]
    verify = []
    for prompt in cost_prompts:
        trace = plain.generate(prompt, max_new_tokens=COST_TOKENS).trace
        verify += [r.verify_s for r in trace[1:]]  # the first round holds the prefill
    result["cost_ms"]["target_token"] = round(1000 * sorted(verify)[len(verify) // 2], 2)
    for name in names:
        gen = Generator.from_pretrained(args.target, [name], policy="fixed:0", draft_len=4)
        gen.generate(cost_prompts[0], max_new_tokens=8)  # warm-up
        drafted = seconds = 0.0
        for prompt in cost_prompts:
            for r in gen.generate(prompt, max_new_tokens=COST_TOKENS).trace:
                drafted += r.drafted
                seconds += r.draft_s
        result["cost_ms"][name] = round(1000 * seconds / max(drafted, 1), 3)
        logging.info("%s: %.3f ms a drafted token", name, result["cost_ms"][name])
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["cost_ms"], indent=2))


if __name__ == "__main__":
    main()
