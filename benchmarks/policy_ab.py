"""Interleaved A/B of policies and arm layouts on the zoo dev set: speedup over plain decoding.

Every configuration runs on the same prompts in one process, prompt by prompt (prompt-major), so
slow drifts of the machine hit all of them alike; outputs are checked equal to plain decoding.
Speedup = total tokens / total time, against plain decoding (`ar`) timed in the same loop.

    python benchmarks/policy_ab.py --config "pld@4=fixed|pld@4|pld" --config ctx-ucb=ctx-ucb \
        --config "rule=rule|pld@8,auto@4" --repeats 2 --zoo-corpus BUILD

``--config LABEL=POLICY[|ARMS[|POOL]]``: a policy spec and, optionally, an explicit arm list and
its own drafter pool (specs separated by ``;``; default ``--pool``). A pool with white-box heads
costs every arm a split prompt prefill, so single-drafter rows are fairest with a pool of that
drafter alone. ``--shuffle SEED`` mixes the domains: bench groups prompts by domain, which
favours learners that keep evidence across queries. ``rule`` is a reference policy defined here,
not a learner: arm 0 when PLD has a match this round, else arm 1 (``rule:on=suffix``: when the suffix
drafter has one). A pool spec ``suffix>=N`` is the suffix drafter with proposals shorter than N tokens
dropped, so ``rule:on=suffix`` over it plays arm 0 only where the suffix drafter proposes ≥ N tokens.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
from common import answerable, dev_prompts, dev_set_parser, zoo_target  # benchmarks/common.py

THREADS = 1  # the machine's other core stays free for other work
PER_DOMAIN = 4  # dev prompts per domain
MAX_NEW = 128


def register_rule_policy() -> None:
    from draftwise.policies import register_policy
    from draftwise.policies.contextual import ContextualUCBPolicy

    @register_policy("rule")
    class RulePolicy(ContextualUCBPolicy):
        """Reference: arm 0 when the lookup matches this round, else arm 1 (no learning)."""

        summary = "reference rule: arm 0 when PLD matches, else arm 1"

        def select(self) -> int:
            return 0 if self.key == (True,) else 1


def build_pool(specs: list[str], model: Any, tokenizer: Any, options: Any) -> list[Any]:
    """``build_drafters`` plus ``suffix>=N`` (see the module docstring)."""
    from draftwise.drafters import build_drafters

    pool = []
    for spec in specs:
        name, sep, least = spec.partition(">=")
        pool.extend(build_drafters([name], model, tokenizer, options))
        if sep:
            pool[-1] = MinLength(pool[-1], int(least))
    return pool


class MinLength:
    """A lookup drafter whose proposals shorter than ``least`` tokens are dropped (reference rules)."""

    def __init__(self, drafter: Any, least: int) -> None:
        self.inner, self.least = drafter, least

    def __getattr__(self, name: str) -> Any:  # everything else is the drafter's own
        if name == "inner":  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def propose(self, context: Sequence[int], max_len: int, ctx: Any, stop: Any = None) -> Any:
        from draftwise.verify.draft import Draft

        draft = self.inner.propose(context, max_len, ctx, stop)
        return draft if len(draft.tokens) >= self.least else Draft([])


def main() -> None:
    parser = dev_set_parser(__doc__, PER_DOMAIN, THREADS, temperature=0.0)
    parser.add_argument("--config", action="append", required=True, help="LABEL=POLICY[|ARMS[|POOL]] (repeatable)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--pool", default="zoo:all;pld;suffix", help="drafter pool: specs separated by semicolons")
    parser.add_argument("--no-screen", action="append", default=[], metavar="LABEL",
                        help="run this config without the coupled-sampling noise screen (repeatable)")
    parser.add_argument("--no-route-memory", action="append", default=[], metavar="LABEL",
                        help="run this config with routing on the prompt alone "
                             "(draftwise.decision.routing.RouteMemory off; repeatable)")
    parser.add_argument("--unpriced", action="append", default=[], metavar="LABEL",
                        help="run this config without priced lookup drafts (draftwise.decision.pricing; repeatable)")
    parser.add_argument("--priced", action="append", default=[], metavar="LABEL",
                        help="price this config's lookup drafts even under a fixed policy (repeatable)")
    parser.add_argument("--shuffle", type=int, default=None, metavar="SEED",
                        help="run the prompts in a random order (default: grouped by domain, as bench runs them)")
    args = parser.parse_args()
    labels = [item.partition("=")[0] for item in args.config]
    for option, named in (("--no-screen", args.no_screen), ("--no-route-memory", args.no_route_memory),
                          ("--unpriced", args.unpriced), ("--priced", args.priced)):
        unknown = sorted(set(named) - set(labels))
        if unknown:
            parser.error(f"{option} {', '.join(unknown)}: no such --config label (labels: {', '.join(labels)})")
    prompts = dev_prompts(args)
    from draftwise import Generator
    from draftwise.decision.pricing import DraftAcceptance
    from draftwise.drafters.suffix import forget_stored_answers

    register_rule_policy()
    model, tokenizer, options = zoo_target(args.target, args.numerics)
    generators = {"ar": Generator(model, tokenizer, [], policy="fixed")}
    for item in args.config:
        label, _, spec = item.partition("=")
        policy, _, rest = spec.partition("|")
        arms, _, pool_spec = rest.partition("|")
        pool = build_pool((pool_spec or args.pool).split(";"), model, tokenizer, options)
        generators[label] = Generator(model, tokenizer, pool, policy=policy, arms=arms or None)
        if label in args.no_screen:
            generators[label].engine.noise_screen = None
        if label in args.no_route_memory:
            generators[label].engine.routes.weight = 0.0
        if label in args.unpriced:
            generators[label].engine.pricing = None
        if label in args.priced:
            generators[label].engine.pricing = DraftAcceptance()
    if args.shuffle is not None:  # learners that keep evidence across queries must not need domain runs
        prompts = [prompts[i] for i in np.random.default_rng(args.shuffle).permutation(len(prompts))]
    ids = [generators["ar"].encode(p.text) for p in prompts]
    fits = answerable(model, ids, MAX_NEW)
    prompts, ids = [prompts[i] for i in fits], [ids[i] for i in fits]
    for gen in generators.values():  # warm-up, untimed
        gen.generate(ids[0], max_new_tokens=16, temperature=args.temperature)
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for _ in range(args.repeats):
        for gen in generators.values():  # every repeat starts cold: no answers from the warm-up or a repeat
            forget_stored_answers(gen.drafters)
        for index, (prompt, tokens) in enumerate(zip(prompts, ids)):
            reference = None
            for label, gen in generators.items():
                start = time.perf_counter()
                out = gen.generate(tokens, max_new_tokens=MAX_NEW, temperature=args.temperature, seed=index)
                elapsed = time.perf_counter() - start
                reference = out.token_ids if reference is None else reference
                assert out.token_ids == reference, f"{label}: output differs from plain decoding (same seed)"
                for key in ((label, "overall"), (label, prompt.domain)):
                    totals[key][0] += elapsed
                    totals[key][1] += len(out.token_ids)
    domains = ["overall", *sorted({p.domain for p in prompts})]
    print(f"{'config':28s} " + " ".join(f"{d[:7]:>7s}" for d in domains))
    for label in generators:
        speed = [totals[(label, d)][1] / totals[(label, d)][0] / (totals[("ar", d)][1] / totals[("ar", d)][0])
                 for d in domains]
        print(f"{label:28s} " + " ".join(f"{s:7.3f}" for s in speed))


if __name__ == "__main__":
    from draftwise.errors import DraftwiseError

    try:
        main()
    except DraftwiseError as exc:  # bad input: one line, not a traceback
        raise SystemExit(f"policy_ab.py: error: {exc}") from None
