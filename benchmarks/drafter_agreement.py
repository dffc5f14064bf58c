"""How well each zoo drafter agrees with the target on the target's own answers, and what routing picks.

Agreement per answer position: greedy (``--temperature 0``) whether the drafter's top-1 is the
target's token; sampled, Σ min(p, q) = 1 − TV of the two warped distributions (a chain draft's
per-token acceptance under rejection sampling). No clock: the figures are the same on any machine.
The routed arm's pick (the prompt fit, :class:`draftwise.decision.routing.PromptFit`) is reported per
domain with the agreement it gets, against the best single drafter's, and so is the pick of routing
as the engine does it for sampled queries: the prompt fit moved by what a
:class:`~draftwise.decision.routing.RouteMemory` learned from the earlier prompts' answers (the
prompts in the order given, the memory taught as the engine teaches it).

    python benchmarks/drafter_agreement.py --per-domain 3                                # zoo:dev
    python benchmarks/drafter_agreement.py --prompt-file ../shared/data/self_instruct/seed_tasks.jsonl \
        --per-domain 20                                                                  # check set
"""

from __future__ import annotations

from collections import Counter, defaultdict

from dev_set import answerable, dev_prompts, dev_set_parser, zoo_target  # benchmarks/dev_set.py

PER_DOMAIN = 3
MAX_NEW = 128


def main() -> None:
    parser = dev_set_parser(__doc__, PER_DOMAIN, temperature=0.7)
    args = parser.parse_args()
    prompts = dev_prompts(args)
    import torch

    from draftwise import Generator
    from draftwise.decision.routing import PromptFit, RouteMemory, best_fit, learn_route
    from draftwise.drafters import DraftContext, build_drafters
    from draftwise.verify.chain import Sampling, warp

    model, tokenizer, options = zoo_target(args.target, args.numerics)
    drafters = build_drafters(["zoo:all"], model, tokenizer, options)
    names = [d.name for d in drafters]
    plain = Generator(model, tokenizer, [], policy="fixed")
    sampling = Sampling(temperature=args.temperature)
    fit = PromptFit()
    context = DraftContext()
    agree: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])  # (domain, drafter): sum, n
    routed: dict[str, Counter[str]] = defaultdict(Counter)
    routed_agree: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    memory = RouteMemory()
    learned: dict[str, Counter[str]] = defaultdict(Counter)
    learned_agree: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    encoded = [plain.encode(prompt.text) for prompt in prompts]
    candidates = range(len(drafters))
    kept = answerable(model, encoded, MAX_NEW)
    for index in kept:  # the index seeds the prompt's sampled answer
        prompt, ids = prompts[index], encoded[index]
        answer = plain.generate(ids, max_new_tokens=MAX_NEW, temperature=args.temperature, seed=index).token_ids
        full = torch.tensor([ids + answer])
        start = len(ids) - 1  # the row predicting the answer's first token
        rates = fit.rates(drafters, ids, candidates, context)
        pick = names[best_fit(candidates, rates)]
        routed[prompt.domain][pick] += 1
        moved = names[best_fit(candidates, rates, memory)]
        learned[prompt.domain][moved] += 1
        learn_route(fit, drafters, memory, ids + answer, len(ids), rates, context)
        with torch.inference_mode():
            target = model(full).logits[0, start:-1].float()
            for drafter in drafters:
                logits = drafter.hf_model()(full).logits[0, start:-1].float()
                if sampling.greedy:
                    per_token = (logits.argmax(-1) == target.argmax(-1)).float()
                else:
                    per_token = torch.minimum(warp(target, sampling), warp(logits, sampling)).sum(-1)
                cell = agree[(prompt.domain, drafter.name)]
                cell[0] += float(per_token.sum())
                cell[1] += len(per_token)
                for name, cells in ((pick, routed_agree), (moved, learned_agree)):
                    if drafter.name == name:
                        cells[prompt.domain][0] += float(per_token.sum())
                        cells[prompt.domain][1] += len(per_token)
    kind = "top-1 agreement (greedy)" if sampling.greedy else f"1 − TV at T {args.temperature}"
    print(f"{kind} on the target's answers, {len(kept)} prompts, {MAX_NEW} tokens")
    print(f"{'domain':14s} " + " ".join(f"{n[:7]:>7s}" for n in names)
          + "   routed to (prompts)         routed   learned routing to          learned  best")
    for domain in sorted({p.domain for p in prompts}):
        values = [agree[(domain, n)][0] / max(agree[(domain, n)][1], 1.0) for n in names]
        row = " ".join(f"{v:7.2f}" for v in values)
        cells = []
        for picks, got in ((routed, routed_agree), (learned, learned_agree)):
            cells.append(f"{', '.join(f'{n} {c}' for n, c in picks[domain].most_common(3)):28s} "
                         f"{got[domain][0] / max(got[domain][1], 1.0):5.2f}")
        print(f"{domain:14s} {row}   {'   '.join(cells)}  {max(values):5.2f}")


if __name__ == "__main__":
    from draftwise.errors import DraftwiseError

    try:
        main()
    except DraftwiseError as exc:  # bad input: one line, not a traceback
        raise SystemExit(f"drafter_agreement.py: error: {exc}") from None
