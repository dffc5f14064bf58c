"""How much could per-round draft lengths gain over the suffix drafter alone? A clairvoyant bound.

Runs plain decoding and ``fixed`` suffix@L on the same prompts (one seed per prompt: under
sampling the same text for both, coupled sampling), then replays suffix@L's own rounds with a
per-round oracle that drafts exactly the tokens that were accepted (nothing where none were). It
emits the same tokens every round, so it follows the same trajectory and its cost is exact up to the
cost model: the median measured round time by number of drafted tokens (rounds after the first;
round 1 also reads the prompt and is kept as measured). No online learner choosing when and how long
to draft from this drafter's proposals can beat this bound.

    python benchmarks/length_oracle.py --zoo-corpus BUILD [--data self_instruct] [--temperature 0.7]

``--data``: ``zoo:dev`` (default, ``--per-domain`` per domain) or any ``draftwise bench --data``
source; prompts longer than the target's context minus ``--max-new-tokens`` are skipped.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

from dev_set import answerable, dev_prompts, dev_set_parser, zoo_target  # benchmarks/dev_set.py

PER_DOMAIN = 8


def round_costs(traces: list[list]) -> dict[int, float]:
    """Median seconds of a round by the number of tokens it drafted (rounds after the first)."""
    times: dict[int, list[float]] = defaultdict(list)
    for trace in traces:
        for record in trace[1:]:
            times[record.drafted].append(record.seconds)
    return {k: statistics.median(v) for k, v in times.items()}


def cost_of(costs: dict[int, float], drafted: int) -> float:
    """The measured cost of drafting ``drafted`` tokens, or of the nearest longer draft measured."""
    known = sorted(costs)
    return costs[next((k for k in known if k >= drafted), known[-1])]


def main() -> None:
    parser = dev_set_parser(__doc__, PER_DOMAIN, temperature=0.0)
    parser.add_argument("--data", default="zoo:dev")
    parser.add_argument("--draft-len", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    prompts = dev_prompts(args)
    if args.data != "zoo:dev":
        from draftwise.bench.datasets import PromptRequest, load_prompt_sources

        prompts = load_prompt_sources([args.data], PromptRequest("first", None, args.zoo_corpus, 0))
    from draftwise import Generator
    from draftwise.drafters import build_drafters

    model, tokenizer, options = zoo_target(args.target, args.numerics)
    plain = Generator(model, tokenizer, [], policy="fixed")
    lookup = Generator(model, tokenizer, build_drafters(["suffix"], model, tokenizer, options), policy="fixed",
                       arms=f"suffix@{args.draft_len}")
    encoded = [plain.encode(p.text) for p in prompts]
    ids = [encoded[i] for i in answerable(model, encoded, args.max_new_tokens)]
    for gen in (plain, lookup):  # warm-up, untimed; the suffix store starts empty after it
        gen.generate(ids[0], max_new_tokens=16, temperature=args.temperature)
    from draftwise.drafters.suffix import forget_stored_answers

    forget_stored_answers(lookup.drafters)
    walls = {"ar": 0.0, "suffix": 0.0}
    traces = []
    for index, tokens in enumerate(ids):
        for label, gen in (("ar", plain), ("suffix", lookup)):
            start = time.perf_counter()
            out = gen.generate(tokens, max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=index)
            walls[label] += time.perf_counter() - start
            if label == "suffix":
                traces.append(out.trace)
    costs = round_costs(traces)
    played = sum(cost_of(costs, r.drafted) for t in traces for r in t[1:])
    oracle = sum(cost_of(costs, r.accepted) for t in traces for r in t[1:])
    unchanged = walls["suffix"] - played  # round 1, the loop around the rounds: the oracle keeps them
    print(f"{len(ids)} prompts, {args.data}, T {args.temperature}, suffix@{args.draft_len}")
    print("round cost by drafted tokens (ms): " + ", ".join(f"{k}: {1000 * v:.2f}" for k, v in sorted(costs.items())))
    print(f"suffix@{args.draft_len}: {walls['ar'] / walls['suffix']:.3f}x plain decoding")
    print(f"per-round length oracle: {walls['ar'] / (unchanged + oracle):.3f}x plain decoding, "
          f"{walls['suffix'] / (unchanged + oracle):.3f}x suffix@{args.draft_len}")


if __name__ == "__main__":
    main()
