"""Coupled lookups: accepted draft tokens of the suffix drafter with and without the noise.

Under coupled sampling every configuration writes the same text for a seed, so they can be compared
by counts instead of time: rounds, drafted and accepted tokens (exact, the same on any machine).
``suffix:coupled=1`` follows, where its trie branches, the Gumbel-max of the counts with the
target's own noise; ``suffix`` (the default) follows the most frequent continuation. Each alone (``fixed:suffix@8``)
and in the default's pick (``fixed:suffix/pld@8``).

    python benchmarks/coupled_lookups.py --temperature 0.7                              # zoo:dev
    python benchmarks/coupled_lookups.py --temperature 0.7 \
        --prompt-file ../shared/data/self_instruct/seed_tasks.jsonl --per-domain 60     # check set
"""

from __future__ import annotations

from dev_set import dev_prompts, dev_set_parser, zoo_target  # benchmarks/dev_set.py

PER_DOMAIN = 8
MAX_NEW = 128
CONFIGS = {  # label: (arms, pool)
    "suffix@8 coupled=1": ("suffix@8", ["suffix:coupled=1"]),
    "suffix@8": ("suffix@8", ["suffix"]),
    "suffix/pld@8 coupled=1": ("suffix/pld@8", ["pld", "suffix:coupled=1"]),
    "suffix/pld@8": ("suffix/pld@8", ["pld", "suffix"]),
}


def main() -> None:
    parser = dev_set_parser(__doc__, PER_DOMAIN, temperature=0.7)
    args = parser.parse_args()
    prompts = dev_prompts(args)
    from draftwise import Generator
    from draftwise.drafters import build_drafters

    model, tokenizer, options = zoo_target(args.target, args.numerics)
    texts: list[list[int]] | None = None
    print(f"{'config':24s} {'tokens':>7s} {'rounds':>7s} {'MAT':>6s} {'drafted':>8s} {'accepted':>9s}")
    for label, (arms, pool) in CONFIGS.items():
        gen = Generator(model, tokenizer, build_drafters(pool, model, tokenizer, options), policy="fixed", arms=arms)
        outs = [gen.generate(gen.encode(p.text), max_new_tokens=MAX_NEW, temperature=args.temperature, seed=i)
                for i, p in enumerate(prompts)]
        mine = [o.token_ids for o in outs]
        texts = mine if texts is None else texts
        assert mine == texts, f"{label}: another text for the same seeds"
        tokens, rounds = sum(len(t) for t in mine), sum(o.stats.rounds for o in outs)
        drafted, accepted = sum(o.stats.drafted for o in outs), sum(o.stats.accepted for o in outs)
        print(f"{label:24s} {tokens:7d} {rounds:7d} {tokens / rounds:6.3f} {drafted:8d} {accepted:9d}")


if __name__ == "__main__":
    main()
