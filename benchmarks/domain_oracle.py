"""Mixed-domain batches with each sequence's drafter fixed by its domain: what per-sequence
drafter choice can reach when it knows every prompt's domain in advance.

The bench's mixed set-up (``draftwise bench --batch-size 8``): prompts interleaved by domain,
continuous batching, greedy, 128 tokens, per-query lanes with the engine's load cap and width cut
(as ``fixed:NAME@L`` runs). Each assignment maps domains to arms (``suffix@8``, ``pld@8``,
``NAME@4`` / ``NAME@3`` for every zoo LM drafter, ``none``); a domain it leaves out gets ``--base``.
The harness replaces each lane's learner with a fixed one on its domain's arm (the batched engine
takes no per-query policy). Assignments and ``ar`` (batched plain decoding) run in turn within each
repeat, the order rotating; outputs that differ from ``ar``'s are reported.

    python benchmarks/domain_oracle.py --assignments '[{"code": "code@4"}, {"qa": "qa@4"}]' \\
        --repeats 3 --out runs/domain-oracle.json
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from common import dev_prompts, dev_set_parser, rotated, zoo_target  # benchmarks/common.py

PER_DOMAIN = 4


def main() -> None:
    parser = dev_set_parser(__doc__, PER_DOMAIN)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--assignments", default="[]", help="JSON list of {domain: arm}")
    parser.add_argument("--base", default="suffix@8", help="the arm of every domain an assignment leaves out")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import draftwise.engine.batch as batch
    from draftwise import Generator
    from draftwise.bench.batched import interleave_domains
    from draftwise.drafters import ModelDrafter, build_drafters
    from draftwise.drafters.suffix import forget_stored_answers
    from draftwise.policies import make_policy

    prompts = dev_prompts(args)
    model, tokenizer, options = zoo_target(args.target, args.numerics)
    pool = build_drafters(["zoo:all", "pld", "suffix"], model, tokenizer, options)
    models = [d.name for d in pool if isinstance(d, ModelDrafter)]
    arms = ["suffix@8", "pld@8", *[f"{n}@{k}" for k in (4, 3) for n in models], "none"]
    speculative = Generator(model, tokenizer, pool, policy="fixed", arms=",".join(arms))
    plain = Generator(model, tokenizer, [], policy="fixed")
    arm_index = {arm.name: i for i, arm in enumerate(speculative.arms)}
    order = interleave_domains(prompts)
    ids = [plain.encode(prompts[i].text) for i in order]
    domains = [prompts[i].domain for i in order]
    assignments: list[dict[str, str]] = json.loads(args.assignments)
    for assignment in assignments:
        unknown = sorted(set(assignment.values()) - set(arm_index))
        if unknown:
            parser.error(f"unknown arm(s) {', '.join(unknown)}; arms: {', '.join(arm_index)}")

    # Each lane's learner: a fixed one on the arm of its prompt's domain.
    lane_arm: dict[tuple[int, ...], int] = {}
    joining: dict[str, int | None] = {"arm": None}
    add_lane, lane_policy = batch.BatchEngine._add_lane, batch.BatchEngine._lane_policy

    def add_fixed_lane(self: Any, prompt: Sequence[int], *rest: Any) -> Any:
        joining["arm"] = lane_arm.get(tuple(prompt))
        return add_lane(self, prompt, *rest)

    def fixed_policy(self: Any, seed: int) -> Any:
        if joining["arm"] is None:
            return lane_policy(self, seed)
        return make_policy(f"fixed:arm={joining['arm']}", [a.name for a in self.arms], np.random.default_rng(seed))

    batch.BatchEngine._add_lane = add_fixed_lane  # type: ignore[method-assign]
    batch.BatchEngine._lane_policy = fixed_policy  # type: ignore[method-assign]

    def run(assignment: dict[str, str] | None) -> tuple[float, list[list[int]]]:
        gen = plain if assignment is None else speculative
        forget_stored_answers(gen.drafters)  # every run starts cold
        lane_arm.clear()
        if assignment is not None:
            lane_arm.update({tuple(p): arm_index[assignment.get(d, args.base)] for p, d in zip(ids, domains)})
        start = time.perf_counter()
        session = gen.batch_session(args.batch_size)
        handles = [session.add(p, max_new_tokens=args.max_new_tokens) for p in ids]
        session.run()
        return time.perf_counter() - start, [h.result.token_ids for h in handles]

    labels: list[dict[str, str] | None] = [None, {}, *assignments]  # ar, every domain on --base, the rest
    run(None), run({})  # warm-up
    speeds: list[list[float]] = [[] for _ in labels]
    for repeat in range(args.repeats):
        outputs: dict[int, list[list[int]]] = {}
        for i in rotated(list(range(len(labels))), repeat):
            wall, outputs[i] = run(labels[i])
            speeds[i].append(sum(len(o) for o in outputs[i]) / wall)
        for i in outputs:  # batching's rounding may move a near-tie (the bench counts those apart)
            differ = sum(a != b for a, b in zip(outputs[i], outputs[0]))
            if differ:
                print(f"repeat {repeat}: {differ} output(s) differ from ar's: {labels[i]}")
    results = []
    for label, speed in zip(labels, speeds):
        ratio = np.array(speed) / np.array(speeds[0])
        name = "ar" if label is None else json.dumps(label) if label else f"every domain {args.base}"
        results.append({"assignment": name, "tokens_s": float(np.mean(speed)), "x_ar": float(ratio.mean()),
                        "x_ar_std": float(ratio.std())})
        print(f"{np.mean(speed):7.1f} tokens/s  × ar {ratio.mean():.3f} ± {ratio.std():.3f}  {name}")
    with open(args.out, "w") as handle:
        json.dump({"args": vars(args), "results": results, "tokens_s": speeds}, handle, indent=1)


if __name__ == "__main__":
    main()
