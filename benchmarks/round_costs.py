"""Where a round's time goes inside the decode loop: the target's verification time by number of
drafted tokens, and an LM drafter's cost per forward (catch-up vs one drafted token), from the
traces of the default policy on the zoo dev set (medians; warm-up excluded).

    python benchmarks/round_costs.py --zoo-corpus BUILD
    python benchmarks/round_costs.py --policy fixed --arms suffix/pld@8 --pool "pld;suffix" \
        --prompt-file ../shared/data/self_instruct/seed_tasks.jsonl --per-domain 60

Each row also says how many of its rounds' drafted tokens were accepted (mean): whether a draft of
that length paid for its verification on this machine.

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
    parser = dev_set_parser(__doc__, PER_DOMAIN, THREADS)
    parser.add_argument("--policy", default=None, help="default: draftwise's default policy")
    parser.add_argument("--arms", default=None, help="an arm list (default: the policy's layout)")
    parser.add_argument("--pool", default="zoo:all;pld;suffix", help="drafter specs separated by semicolons")
    args = parser.parse_args()
    prompts = dev_prompts(args)
    from draftwise import Generator
    from draftwise.api import DEFAULT_POLICY
    from draftwise.drafters import LMDrafter

    forwards: dict[str, list[float]] = defaultdict(list)
    gen = Generator.from_pretrained("zoo:target", args.pool.split(";"), policy=args.policy or DEFAULT_POLICY,
                                    arms=args.arms)
    for drafter in gen.drafters:  # each LM drafter's cache, timed: catch-up (logits) or one drafted token
        if isinstance(drafter, LMDrafter):
            drafter.lm = TimedCache(drafter.lm, forwards)
    gen.generate(prompts[0].text, max_new_tokens=16)  # warm-up
    forwards.clear()
    verify: dict[int, list[float]] = defaultdict(list)
    accepted: dict[int, list[int]] = defaultdict(list)
    for prompt in prompts:
        for record in gen.generate(prompt.text, max_new_tokens=MAX_NEW).trace[1:]:  # round 1 holds the prompt
            verify[record.drafted + 1].append(record.verify_s)
            accepted[record.drafted + 1].append(record.accepted)
    print("verification by tokens fed (drafted + 1): median ms (rounds), mean accepted")
    for fed in sorted(verify):
        print(f"  {fed:2d}: {statistics.median(verify[fed]) * 1000:6.2f} ({len(verify[fed])}), "
              f"{statistics.mean(accepted[fed]):.2f}")
    print("LM drafter forwards in the loop: median ms (calls)")
    for name, times in forwards.items():
        print(f"  {name}: {statistics.median(times) * 1000:.3f} ({len(times)})")


class TimedCache:
    """An LM drafter's token cache whose catch-up forwards and drafted tokens are timed."""

    def __init__(self, inner, forwards: dict[str, list[float]]) -> None:
        self.inner, self.forwards = inner, forwards

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def _timed(self, name: str, method, *args):
        start = time.perf_counter()
        out = method(*args)
        self.forwards[name].append(time.perf_counter() - start)
        return out

    def logits(self, tokens, n_out=1):
        return self._timed("catch-up forward (logits)", self.inner.logits, tokens, n_out)

    def extend(self, new_tokens, n_out=1):
        return self._timed("one drafted token (extend)", self.inner.extend, new_tokens, n_out)


if __name__ == "__main__":
    main()
