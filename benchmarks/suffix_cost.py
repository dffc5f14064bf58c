"""What the suffix drafter's upkeep costs per proposal: one drafter following 24 queries (a prompt of
150 tokens, an answer of 128, a proposal every 3 tokens) with a store of 8 earlier answers, on
repetitive synthetic text (phrases reused). Best of ``--repeats`` passes; the drafts are counted so
that two versions can be checked to draft alike.

    python benchmarks/suffix_cost.py [--repeats 5] [--seed 0]

The trie's upkeep (every new token extends ``depth`` suffixes) is most of a lookup-led round's
drafting, and it is paid per request per step inside vLLM.
"""

from __future__ import annotations

import argparse
import random
import time

from draftwise.drafters import DraftContext, SuffixDrafter
from draftwise.verify import Sampling

VOCAB = 400


def synthetic_text(rng: random.Random, n: int) -> list[int]:
    phrases = [[rng.randrange(VOCAB) for _ in range(rng.randrange(3, 9))] for _ in range(60)]
    out: list[int] = []
    while len(out) < n:
        out += rng.choice(phrases)
    return out[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    ctx = DraftContext(Sampling())
    queries = [(synthetic_text(rng, 150), synthetic_text(rng, 128)) for _ in range(32)]
    times: list[float] = []
    for _ in range(args.repeats):
        drafter = SuffixDrafter()
        for prompt, answer in queries[:8]:  # the store of earlier answers
            drafter.end_query(prompt + answer, len(prompt))
        proposals = drafted = 0
        start = time.perf_counter()
        for prompt, answer in queries[8:]:
            drafter.begin_query(prompt)
            for end in range(len(prompt), len(prompt) + len(answer), 3):
                drafted += len(drafter.propose(prompt + answer[: end - len(prompt)], 8, ctx).tokens)
                proposals += 1
        drafter.end_query(prompt + answer, len(prompt))
        times.append((time.perf_counter() - start) / proposals)
    print(f"{min(times) * 1e6:.1f} µs per proposal (best of {args.repeats}; {proposals} proposals, "
          f"{drafted} tokens drafted, seed {args.seed})")


if __name__ == "__main__":
    main()
