"""Evaluation-phase overhead (HedgeSpec's full-information feedback) per round, as a share of one
target forward, with 4 LM drafters of the zoo's drafter size — batched on a LlamaBank or one by one
through transformers — and with a pool of PLD + suffix only.

Zoo-shaped random-weight models (target 4 × 384, drafters 1 × 128, vocab 8192) unless --zoo.
Warm-up excluded; medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from zoo_shaped import zoo_shaped_models  # benchmarks/zoo_shaped.py

THREADS = 2  # the machine's cores
NEW_TOKENS = 96  # tokens per query
QUERIES = 4  # timed queries per configuration


@torch.inference_mode()
def target_forward_ms(model, context: int = 160, repeats: int = 60) -> float:
    from draftwise.models.cached_lm import CachedLM

    lm = CachedLM(model)
    tokens = list(range(10, 10 + context))
    lm.logits(tokens, 1)
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        lm.extend([11 + i % 50], 1)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zoo", action="store_true", help="use zoo:target and four zoo drafters")
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    from draftwise import Generator

    hf_logging.disable_progress_bar()
    tmp = tempfile.TemporaryDirectory()
    if args.zoo:
        from draftwise.zoo import zoo_drafter_names

        target, drafters = "zoo:target", [f"zoo:{n}" for n in zoo_drafter_names()[:4]]
    else:
        target, drafters = zoo_shaped_models(Path(tmp.name), drafters=4)
    prompts = [[(7 * q + 3 * i) % 8000 + 10 for i in range(48)] for q in range(QUERIES + 1)]
    # (pool, policy, lean batched path, drafter LM-head dtype)
    configs = {
        "4 LM, batched (bank), bf16 heads, every round": (drafters, "normalhedge", True, "bfloat16"),
        "4 LM, batched (bank), fp32 heads, every round": (drafters, "normalhedge", True, "float32"),
        "4 LM, one by one (transformers), every round": (drafters, "normalhedge", False, None),
        "4 LM, batched, bf16 heads, hedgespec (skip 6 tokens)": (drafters, "hedgespec", True, "bfloat16"),
        "4 LM, batched, fp32 heads, hedgespec (skip 6 tokens)": (drafters, "hedgespec", True, "float32"),
        "PLD + suffix only, every round": (["pld", "suffix"], "normalhedge", True, None),
    }
    forward_ms = None
    figures: dict[str, dict[str, float]] = {}
    for label, (pool, policy, fast, head) in configs.items():
        gen = Generator.from_pretrained(target, pool, policy=policy, fast_drafters=fast, drafter_head_dtype=head)
        if forward_ms is None:
            forward_ms = target_forward_ms(gen.model)
        gen.generate(prompts[0], max_new_tokens=16, ignore_eos=True)  # warm-up
        per_round = []
        for prompt in prompts[1:]:
            result = gen.generate(prompt, max_new_tokens=NEW_TOKENS, ignore_eos=True)
            per_round.extend(r.eval_s * 1000 for r in result.trace)
        mean_ms = statistics.mean(per_round)
        figures[label] = {"eval_ms_per_round": mean_ms, "share_of_target_forward": mean_ms / forward_ms}
    print(json.dumps({"target_forward_ms": forward_ms, "configs": figures}, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps({"target_forward_ms": forward_ms, "configs": figures}, indent=2))


if __name__ == "__main__":
    main()
