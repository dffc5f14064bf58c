"""What a query's join costs the batched engine, prefill left out: ``BatchEngine._add_lane`` (drafter
copies, their banks, the learner's copy, the engine's start) and its parts, in ms per lane, with
the default's pool (the zoo's LM drafters, PLD, suffix). 2026-11-26, a 2-core CPU: 0.58–0.80 ms.

    python benchmarks/join_cost.py [--policy ctx-ucb:opening=16] [--lanes 50]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from draftwise.api import DEFAULT_POLICY, Generator
from draftwise.drafters.pool import attach_banks
from draftwise.engine.query import QuerySettings
from draftwise.verify.chain import Sampling


def per_call_ms(work: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        work()
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policy", default=DEFAULT_POLICY)
    parser.add_argument("--lanes", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = Generator.from_pretrained("zoo:target", ["zoo:all", "pld", "suffix"], policy=args.policy) \
        .batch_session(max_batch=64).engine
    settings = QuerySettings(64, Sampling(), frozenset())
    prompt = list(range(5, 60))

    def join_and_leave() -> None:
        lane = engine._add_lane(prompt, settings, None, 0)
        engine.target.drop_row(lane.row)
        engine.lanes.remove(lane)

    per_call_ms(join_and_leave, 20)  # warm-up
    joins = [per_call_ms(join_and_leave, args.lanes) for _ in range(3)]
    copies = [engine.pool.copies() for _ in range(args.lanes)]
    print(f"join: {', '.join(f'{ms:.2f}' for ms in joins)} ms a lane ({args.policy})")
    print(f"  drafter copies {per_call_ms(engine.pool.copies, args.lanes):.2f} ms, "
          f"banks {per_call_ms(lambda: attach_banks(copies.pop(), engine.head_dtype), args.lanes):.2f} ms, "
          f"learner copy {per_call_ms(lambda: engine._lane_policy(0), args.lanes):.2f} ms")


if __name__ == "__main__":
    main()
