"""How often the prompt fit (each model drafter's top-1 accuracy on the prompt's last WINDOW tokens,
seeing CONTEXT tokens before them) picks the domain's own specialist, and what it costs, for
several (WINDOW, CONTEXT) pairs — the routed arm's choice (``draftwise.engine.PromptFit(window, lookback)``;
the engine's defaults are PROMPT_WINDOW / PROMPT_LOOKBACK).

    python benchmarks/prompt_fit.py --zoo-corpus BUILD
"""

from __future__ import annotations

import statistics
import time

from dev_set import dev_prompts, dev_set_parser  # benchmarks/dev_set.py

THREADS = 1
PER_DOMAIN = 8
SEED = 1  # a different sample of dev prompts than the benchmark's (seed 0)
PAIRS = ((64, 32), (48, 16), (32, 16), (32, 8), (24, 8), (16, 8))
SPECIALIST = {"general": "generalist"}  # other domains: the drafter named like the domain


def main() -> None:
    args = dev_set_parser(__doc__, PER_DOMAIN, THREADS).parse_args()
    prompts = dev_prompts(args, SEED)
    from draftwise import Generator
    from draftwise.decision.routing import PromptFit
    from draftwise.drafters import DraftContext
    from draftwise.verify.chain import Sampling

    gen = Generator.from_pretrained("zoo:target", ["zoo:all", "pld"])
    routed = next(arm for arm in gen.arms if arm.route)
    names = [d.name for d in gen.drafters]
    ids = [gen.encode(p.text) for p in prompts]
    ctx = DraftContext(Sampling())
    PromptFit().rates(gen.drafters, ids[0], routed.route, ctx)  # warm-up
    for window, context in PAIRS:
        fit = PromptFit(window, context)
        hits, times = 0, []
        for prompt, tokens in zip(prompts, ids):
            for drafter in gen.drafters:
                drafter.begin_query(tokens)
            start = time.perf_counter()
            rates = fit.rates(gen.drafters, tokens, routed.route, ctx)
            times.append(time.perf_counter() - start)
            best = names[max(routed.route, key=lambda i: rates.get(i, 0.0))]
            hits += best == SPECIALIST.get(prompt.domain, prompt.domain)
        print(f"window {window:2d}, context {context:2d}: specialist picked {hits}/{len(prompts)}, "
              f"median {statistics.median(times) * 1000:.2f} ms")


if __name__ == "__main__":
    main()
