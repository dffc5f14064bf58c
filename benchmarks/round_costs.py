"""Where a round's time goes inside the decode loop: the target's verification time by number of
drafted tokens, and an LM drafter's cost per forward (catch-up vs one drafted token), from the
traces of the default policy on the zoo dev set (medians; warm-up excluded).

    python benchmarks/round_costs.py --zoo-corpus BUILD

Timings inside the loop differ from micro-benchmarks: right after a target forward has evicted the
caches, a drafter's weights and Python's own code run cold.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

from dev_set import dev_prompts, dev_set_parser  # benchmarks/dev_set.py

THREADS = 1
PER_DOMAIN = 4
MAX_NEW = 128


def main() -> None:
    args = dev_set_parser(__doc__, PER_DOMAIN, THREADS).parse_args()
    prompts = dev_prompts(args)
    import draftwise.drafter_bank as drafter_bank
    from draftwise import Generator

    forwards: dict[str, list[float]] = defaultdict(list)

    def timed(name: str, original):  # record each bank-view call: catch-up (logits) or one drafted token
        def wrapper(self, tokens, n_out=1):
            start = time.perf_counter()
            out = original(self, tokens, n_out)
            forwards[name].append(time.perf_counter() - start)
            return out
        return wrapper

    drafter_bank.BankLM.logits = timed("catch-up forward (logits)", drafter_bank.BankLM.logits)
    drafter_bank.BankLM.extend = timed("one drafted token (extend)", drafter_bank.BankLM.extend)
    gen = Generator.from_pretrained("zoo:target", ["zoo:all", "pld", "suffix"])
    gen.generate(prompts[0].text, max_new_tokens=16)  # warm-up
    forwards.clear()
    verify: dict[int, list[float]] = defaultdict(list)
    for prompt in prompts:
        for record in gen.generate(prompt.text, max_new_tokens=MAX_NEW).trace[1:]:  # round 1 holds the prompt
            verify[record.drafted + 1].append(record.verify_s)
    print("verification by tokens fed (drafted + 1): median ms (rounds)")
    for fed in sorted(verify):
        print(f"  {fed:2d}: {statistics.median(verify[fed]) * 1000:6.2f} ({len(verify[fed])})")
    print("LM drafter forwards in the loop: median ms (calls)")
    for name, times in forwards.items():
        print(f"  {name}: {statistics.median(times) * 1000:.3f} ({len(times)})")


if __name__ == "__main__":
    main()
