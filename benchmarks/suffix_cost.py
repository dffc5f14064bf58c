"""What the suffix drafter's upkeep costs per proposal: one drafter following 24 queries (a prompt of
150 tokens, an answer of 128, a proposal every 3 tokens) with a store of 8 earlier answers, on
repetitive synthetic text (phrases reused). Best of ``--repeats`` passes; the drafts are counted so
that two versions can be checked to draft alike.

    python benchmarks/suffix_cost.py [--repeats 5] [--seed 0]
    python benchmarks/suffix_cost.py --full-store     # a full default store: size, fill, per-answer upkeep

``--full-store`` fills a default drafter's store (100,000 tokens) with 800 answers of 125 tokens
(8,000-token vocabulary, 3,000 phrases), then adds 400 more: the trie's nodes, its memory
(tracemalloc, in a separate fill), the fill time, the mean time to store one more answer once the
store is full (evictions and rebuilds included) and the worst single one.

The trie's upkeep (every new token extends ``depth`` suffixes) is most of a lookup-led round's
drafting, and it is paid per request per step inside vLLM.
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc

from draftwise.drafters import DraftContext, SuffixDrafter
from draftwise.verify.chain import Sampling

VOCAB = 400


def synthetic_text(rng: random.Random, n: int, vocab: int = VOCAB, phrases: int = 60) -> list[int]:
    table = [[rng.randrange(vocab) for _ in range(rng.randrange(3, 9))] for _ in range(phrases)]
    out: list[int] = []
    while len(out) < n:
        out += rng.choice(table)
    return out[:n]


def full_store(seed: int) -> None:
    rng = random.Random(seed)
    answers = [[0] * 10 + synthetic_text(rng, 125, vocab=8000, phrases=3000) for _ in range(1200)]
    drafter = SuffixDrafter()
    start = time.perf_counter()
    for answer in answers[:800]:
        drafter.end_query(answer, 10)
    fill = time.perf_counter() - start
    nodes = len(getattr(drafter.global_trie, "count", ()))  # 0: a trie without a node list
    times = []
    for answer in answers[800:]:
        start = time.perf_counter()
        drafter.end_query(answer, 10)
        times.append(time.perf_counter() - start)
    tracemalloc.start()
    traced = SuffixDrafter()
    for answer in answers[:800]:
        traced.end_query(answer, 10)
    megabytes = tracemalloc.get_traced_memory()[0] / 1e6
    tracemalloc.stop()
    print(f"full store: {nodes} trie nodes, {megabytes:.0f} MB, filled in {fill:.2f} s; once full "
          f"{sum(times) / len(times) * 1e3:.1f} ms per stored answer (worst {max(times):.2f} s; seed {seed})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--full-store", action="store_true", help="measure a full store instead (see above)")
    args = parser.parse_args()
    if args.full_store:
        full_store(args.seed)
        return
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
