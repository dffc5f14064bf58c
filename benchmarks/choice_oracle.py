"""How much could choosing each round's drafter *and* length gain over the best single drafter? A
clairvoyant bound, and a replay of causal rules (BENCHMARKS.md, "Ceilings").

For every prompt the target's own greedy answer is decoded once. Along it, at every answer position
t, this records what each arm would have accepted had a round started there:

- the lookups (suffix, PLD): the draft each proposes from the context so far (the suffix drafter's
  store holds the earlier prompts' answers, as in a run), and how many of its tokens match;
- each LM drafter: how many consecutive tokens from t its greedy choice matches, from one
  teacher-forced forward over the answer (along matched tokens its own drafts *are* the answer);
- each white-box head (``--heads``): its own 8-token chain from the target's hidden states, as the
  engine drafts it, and how many of its tokens match; its rounds are timed on their own;
- the causal LM (``--causal-lm``, the generalist): its 8-token greedy draft's confidence per token.

Reported beside the bounds: every single configuration (a lookup at 1–8 tokens, a model drafter at
1–``--max-lm``) replayed alone, the best of them, the per-domain oracle (each domain's best single
configuration in hindsight) and the per-prompt one (each prompt's: a clairvoyant per-sequence
assignment).

Greedy rounds follow the answer whatever they draft, so any policy's rounds can be replayed exactly:

- the oracle: per prompt the cheapest sequence of rounds (dynamic programme), each round none, a
  lookup at any length up to its proposal, or an LM drafter at any length up to ``--max-lm``. It
  knows every acceptance in advance and picks per prompt the LM that serves it best;
- causal rules (:class:`Rule`): the suffix drafter's proposal when it has at least m tokens, else the
  causal LM while its confidence stays ≥ h, up to L tokens; every (m, h, L) of a grid;
- priced rules (:class:`PricedRule`, with ``--fit``): each round the choice with the most expected
  tokens per second, its acceptances predicted by a :class:`Calibration` fitted on another
  collection (the dev split's), the causal LM drafted token by token and its drafting paid whether
  or not its draft is verified.

Sampled (``--temperature`` > 0): the answer is the target's own sample with each prompt's seed (the
bench's ``row_seed``), and under coupled sampling a lookup's token is accepted exactly when it equals
that answer's token there, so the lookups' rounds replay exactly too; a model drafter's are judged
by rejection sampling, which no replay reproduces, so only the lookups are collected (their
configurations, the oracles over them, and the rules with ``max_lm`` 0).

Costs come from runs on the same prompts in the same process: a round verifying k tokens costs the
median measured round of ``fixed`` suffix@8 by k (verification, lookups, bookkeeping); an LM round
of k tokens that plus the median surcharge and k × the median drafting time per token of LM rounds
timed beside the suffix drafter (the reference rule of ``policy_ab.py``: catch-ups after its
stretches and the target's colder caches after LM drafting included). The round reading the prompt
is left out. The replayed suffix@8 and reference rule are checked against their measured rounds.

    python benchmarks/choice_oracle.py --prompt-file ../shared/data/self_instruct/seed_tasks.jsonl \
        --per-domain 40 --out runs/choice-oracle-si.json
    python benchmarks/choice_oracle.py --replay runs/choice-oracle-si.json --out again.json
    python benchmarks/choice_oracle.py --replay runs/choice-oracle-si.json --costs runs/quiet.json --out priced.json
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from common import answerable, cost_of, dev_prompts, dev_set_parser, zoo_target  # benchmarks/common.py
from policy_ab import register_rule_policy

from draftwise.bench.runner import row_seed
from draftwise.decision.pricing import expected_tokens, priced_length
from draftwise.models.cached_lm import common_prefix_len
from draftwise.training.evaluate import HeadReplay
from draftwise.verify.draft import DraftContext

PER_DOMAIN = 8
LOOKUPS = ("suffix", "pld")
Rounds = dict[str, dict[int, float]]  # a model drafter's name → seconds of its round by tokens drafted


def run_lengths(matches: Sequence[bool]) -> list[int]:
    """For each t, how many consecutive matches start at t.

    >>> run_lengths([True, True, False, True])
    [2, 1, 0, 1]
    """
    out = [0] * (len(matches) + 1)
    for t in range(len(matches) - 1, -1, -1):
        out[t] = out[t + 1] + 1 if matches[t] else 0
    return out[:-1]


@dataclass
class Position:
    """What a round starting at one answer position would accept, per arm."""

    proposed: dict[str, int]  # lookup: its proposal's length (≤ 8)
    lookup_ok: dict[str, int]  # lookup: its proposal's tokens that match the answer
    lm_ok: dict[str, int]  # LM drafter: consecutive greedy matches from here
    confidence: list[float] = field(default_factory=list)  # the causal LM's 8-token draft: max prob per token


@dataclass(frozen=True)
class Rule:
    """A causal per-round rule: the suffix drafter's whole proposal when it has at least
    ``min_match`` tokens; else the causal LM drafts while its confidence in the next token stays at
    least ``confidence`` (up to ``max_lm`` tokens; none at all when the first is below it)."""

    min_match: int
    confidence: float
    max_lm: int

    def choose(self, here: Position) -> tuple[str, int]:
        if here.proposed["suffix"] >= self.min_match:
            return "suffix", here.proposed["suffix"]
        k = next((j for j, c in enumerate(here.confidence[: self.max_lm]) if c < self.confidence),
                 min(self.max_lm, len(here.confidence)))
        return ("lm", k) if k else ("none", 0)


def confidence_bin(confidence: float) -> int:
    """A drafted token's confidence in tenths (0–9), what its acceptance is predicted by."""
    return min(int(confidence * 10), 9)


@dataclass(frozen=True)
class Calibration:
    """P(a draft's j-th token is accepted | the ones before it were), counted along one collection's
    answers (add-one smoothed): a lookup's by its proposal's length and j, the causal LM's by its
    token's confidence (:func:`confidence_bin`) and j (0, 1, 2 or later)."""

    accepted: dict[tuple[str, int, int], float]

    @classmethod
    def fit(cls, prompts: Sequence[dict[str, Any]], lm: str) -> Calibration:
        tried: dict[tuple[str, int, int], int] = defaultdict(int)
        kept: dict[tuple[str, int, int], int] = defaultdict(int)
        for record in prompts:
            for here in record["positions"]:
                for name in LOOKUPS:
                    proposed, ok = here["proposed"][name], here["lookup_ok"][name]
                    for j in range(min(proposed, ok + 1)):
                        tried[name, proposed, j] += 1
                        kept[name, proposed, j] += j < ok
                confidence, ok = here["confidence"], here["lm_ok"][lm]
                for j in range(min(len(confidence), ok + 1)):
                    key = ("lm", confidence_bin(confidence[j]), min(j, 2))
                    tried[key] += 1
                    kept[key] += j < ok
        return cls({key: (kept[key] + 1) / (n + 2) for key, n in tried.items()})

    def lookup(self, name: str, proposed: int, j: int) -> float:
        return self.accepted.get((name, proposed, j), 0.5)

    def lm(self, confidence: float, j: int) -> float:
        return self.accepted.get(("lm", confidence_bin(confidence), min(j, 2)), 0.5)


@dataclass(frozen=True)
class PricedRule:
    """Each round, the lookup (suffix or PLD) at the length, up to its proposal, with the most
    expected tokens per second; where that promises less than ``consult`` × a plain round's rate, the
    causal LM drafts token by token while its last token's predicted acceptance stays ≥
    ``confidence`` (up to ``max_lm``), and its best length is verified if it promises more than the
    lookup's choice (its drafting is paid either way: it ran before the choice)."""

    consult: float
    confidence: float
    max_lm: int = 4


def expected_rate(accepts: Sequence[float], seconds: float) -> float:
    """Expected tokens per second of a round verifying a draft whose tokens are accepted (each given
    the ones before) with these probabilities (the engine's own count of them: ``expected_tokens``)."""
    return expected_tokens(accepts, len(accepts)) / seconds


def priced_rule_time(positions: Sequence[Position], verify: dict[int, float], lm_round: dict[int, float],
                     rule: PricedRule, calibration: Calibration, lm: str) -> float:
    """The priced rule's rounds along the answer (exact, as :func:`rule_time`'s)."""
    plain = cost_of(verify, 0)
    drafting = lambda j: cost_of(lm_round, j) - cost_of(verify, j) if j else 0.0  # the LM's j tokens
    t, total, n = 0, 0.0, len(positions)
    while t < n:
        here, room = positions[t], n - t - 1
        best, arm, k = 1 / plain, "none", 0
        for name in LOOKUPS:  # each lookup at its best length (the engine's own argmax), the better of the two
            proposed = here.proposed[name]
            accepts = [calibration.lookup(name, proposed, j) for j in range(min(proposed, room))]
            length = priced_length(accepts, lambda tokens: cost_of(verify, tokens - 1) / plain, min_gain=1.0)
            rate = expected_rate(accepts[:length], cost_of(verify, length))
            if length and rate > best:
                best, arm, k = rate, name, length
        drafted = 0
        if best < rule.consult / plain and room:
            accepts, lm_best, lm_k = [], 0.0, 0
            while drafted < min(rule.max_lm, room):
                drafted += 1
                accepts.append(calibration.lm(here.confidence[drafted - 1], drafted - 1))
                rate = expected_rate(accepts, cost_of(verify, drafted))
                if rate > lm_best:
                    lm_best, lm_k = rate, drafted
                if accepts[-1] < rule.confidence:
                    break
            if lm_best > best:
                arm, k = "lm", lm_k
        total += cost_of(verify, k) + drafting(drafted)
        ok = here.lm_ok[lm] if arm == "lm" else here.lookup_ok[arm] if arm != "none" else 0
        t += min(k, ok) + 1
    return total


def rule_time(positions: Sequence[Position], verify: dict[int, float], rounds: Rounds, rule: Rule,
              lm: str) -> float:
    """The rule's rounds along the answer (exact: greedy rounds follow the answer whatever they draft)."""
    t, total, n = 0, 0.0, len(positions)
    while t < n:
        here = positions[t]
        arm, k = rule.choose(here)
        k = min(k, n - t - 1)
        if arm == "suffix":
            total += cost_of(verify, k)
            t += min(k, here.lookup_ok["suffix"]) + 1
        elif arm == "lm" and k > 0:
            total += cost_of(rounds[lm], k)
            t += min(k, here.lm_ok[lm]) + 1
        else:
            total += cost_of(verify, 0)
            t += 1
    return total


def best_time(positions: Sequence[Position], verify: dict[int, float], rounds: Rounds,
              lms: Sequence[str], max_lm: int) -> float:
    """The cheapest way to emit the answer (``len(positions)`` tokens), every round chosen in
    hindsight: none, a lookup at a length up to its proposal, or an LM drafter (one of ``lms``) up to
    ``max_lm`` tokens; a round's draft never reaches past the answer's last token.

    >>> pos = [Position({"suffix": 2}, {"suffix": 2}, {}), Position({"suffix": 0}, {"suffix": 0}, {}),
    ...        Position({"suffix": 0}, {"suffix": 0}, {})]
    >>> best_time(pos, {0: 1.0, 1: 1.2, 2: 1.5}, {}, [], 4)  # one round drafts 2, all accepted
    1.5
    """
    n = len(positions)
    best = [0.0] * (n + 1)
    for t in range(n - 1, -1, -1):
        room = n - t - 1  # draft tokens that can still be emitted before the target's own
        here = positions[t]
        options = [cost_of(verify, 0) + best[t + 1]]
        for name, length in here.proposed.items():
            for k in range(1, min(length, room) + 1):
                options.append(cost_of(verify, k) + best[t + min(k, here.lookup_ok[name]) + 1])
        for name in lms:
            for k in range(1, min(max_lm, room) + 1):
                options.append(cost_of(rounds[name], k) + best[t + min(k, here.lm_ok[name]) + 1])
        best[t] = min(options)
    return best[0]


def fixed_time(positions: Sequence[Position], verify: dict[int, float], name: str, max_len: int) -> float:
    """The single lookup drafter every round: its whole proposal (up to ``max_len``), verified."""
    t, total, n = 0, 0.0, len(positions)
    while t < n:
        k = min(positions[t].proposed[name], max_len, n - t - 1)
        total += cost_of(verify, k)
        t += min(k, positions[t].lookup_ok[name]) + 1
    return total


def lm_fixed_time(positions: Sequence[Position], verify: dict[int, float], rounds: Rounds, name: str,
                  k: int) -> float:
    """One LM drafter at draft length ``k`` every round."""
    t, total, n = 0, 0.0, len(positions)
    while t < n:
        draft = min(k, n - t - 1)
        total += cost_of(rounds[name], draft) if draft else cost_of(verify, 0)
        t += min(draft, positions[t].lm_ok[name]) + 1
    return total


def single_times(positions: Sequence[Position], verify: dict[int, float], rounds: Rounds,
                 lms: Sequence[str], max_lm: int) -> dict[str, float]:
    """Every single configuration's time on one prompt: each lookup at lengths 1–8, each LM drafter
    at lengths 1–``max_lm``."""
    out = {f"{name}@{k}": fixed_time(positions, verify, name, k) for name in LOOKUPS for k in range(1, 9)}
    out.update({f"{name}@{k}": lm_fixed_time(positions, verify, rounds, name, k) for name in lms
                for k in range(1, max_lm + 1)})
    return out


def round_costs(records: Sequence[Sequence[Any]]) -> dict[int, float]:
    """Median seconds of a round by tokens drafted, its drafting left out (rounds after the first)."""
    times: dict[int, list[float]] = defaultdict(list)
    for trace in records:
        for r in trace[1:]:
            times[r.drafted].append(r.verify_s + r.policy_s)
    return {k: statistics.median(v) for k, v in times.items()}


def lm_round_costs(traces: Sequence[Sequence[Any]], arm: str, verify: dict[int, float], longest: int = 8
                   ) -> dict[int, float]:
    """An LM round of k tokens: the lookup's round of k tokens, plus what verifying after the LM's
    drafting costs more (the median surcharge of ``arm``'s rounds: cold caches), plus k × its median
    drafting time per token (catch-ups included)."""
    rounds = [r for t in traces for r in t[1:] if r.arm_name == arm and r.drafted]
    token_s = statistics.median(r.draft_s / r.drafted for r in rounds)
    # never below the lookup's round of the same length: a noisy median must not make drafting free
    surcharge = max(0.0, statistics.median(r.verify_s + r.policy_s - cost_of(verify, r.drafted) for r in rounds))
    return {k: cost_of(verify, k) + surcharge + k * token_s for k in range(1, longest + 1)}


def lm_drafts(drafter: Any, ids: list[int], answer: list[int], length: int = 8) -> list[list[float]]:
    """The drafter's greedy draft of ``length`` tokens at every answer position: the max
    probability of each drafted token (what a confidence stop sees; its own tokens fed back)."""
    out = []
    with torch.inference_mode():
        for t in range(len(answer)):
            logits = drafter.lm.logits(ids + answer[:t], 1)[0]
            confidence = []
            for j in range(length):
                probs = torch.softmax(logits.float(), -1)
                top = int(probs.argmax())
                confidence.append(float(probs[top]))
                if j < length - 1:
                    logits = drafter.lm.extend([top], 1)[0]
            out.append(confidence)
    return out


def lm_positions(drafter: Any, ids: list[int], answer: list[int]) -> list[int]:
    """Consecutive greedy matches of an LM drafter from each answer position (teacher-forced, over
    the target's vocabulary as the engine sees the drafter's logits)."""
    with torch.inference_mode():
        logits = drafter.lm.logits(ids + answer[:-1], len(answer))
    guesses = logits.argmax(-1).tolist()
    return run_lengths([g == a for g, a in zip(guesses, answer)])


def head_positions(head: Any, model: Any, ids: list[int], answer: list[int], length: int = 8) -> list[int]:
    """A white-box head's greedy matches from each answer position (up to ``length``): its own chain
    of ``length`` tokens at every position, as the engine would draft it."""
    replay = HeadReplay(head, model, ids, answer)
    return [common_prefix_len(replay.draft(t, length), answer[t:]) for t in range(len(answer))]


def collect(args: Any) -> dict[str, Any]:
    """Decode every prompt, time the fixed runs, and record every answer position's arms."""
    from draftwise import Generator
    from draftwise.drafters import ModelDrafter, build_drafters
    from draftwise.drafters.pool import attach_banks
    from draftwise.drafters.suffix import forget_stored_answers

    register_rule_policy()
    prompts = dev_prompts(args)
    model, tokenizer, options = zoo_target(args.target, args.numerics)
    sampled = args.temperature > 0  # lookups only: a model draft's rounds are not replayable (docstring)
    pool = build_drafters([*([] if sampled else ["zoo:all"]), *LOOKUPS], model, tokenizer, options)
    attach_banks(pool)
    lms = {d.name: d for d in pool if isinstance(d, ModelDrafter)}
    # the generalist of the target's zoo ("generalist", "smollm2-generalist")
    args.causal_lm = None if sampled else args.causal_lm or next(name for name in lms if name.endswith("generalist"))
    lookups = {d.name: d for d in pool if d.name in LOOKUPS}
    plain = Generator(model, tokenizer, [], policy="fixed")
    ids = [plain.encode(p.text) for p in prompts]
    keep = answerable(model, ids, args.max_new_tokens)
    prompts, ids = [prompts[i] for i in keep], [ids[i] for i in keep]
    # every generation's settings: greedy, or sampled with the prompt's own seed (the bench's)
    settings = [{"max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                 **({"seed": row_seed(args.seed, p.id, 0)} if sampled else {})} for p in prompts]

    def fixed_run(drafters: list[str], policy: str, arms: str) -> tuple[list[Any], list[list[int]], float]:
        gen = Generator(model, tokenizer, build_drafters(drafters, model, tokenizer, options), policy=policy, arms=arms)
        gen.generate(ids[0], max_new_tokens=8)  # warm-up
        forget_stored_answers(gen.drafters)  # the suffix store starts empty after it
        start, traces, outs = time.perf_counter(), [], []
        for prompt, setting in zip(ids, settings):
            result = gen.generate(prompt, **setting)
            traces.append(result.trace)
            outs.append(result.token_ids)
        return traces, outs, time.perf_counter() - start

    heads = {} if sampled else {d.name: (spec, d) for spec in args.heads
                                for d in build_drafters([spec], model, tokenizer, options)}
    plain.generate(ids[0], max_new_tokens=8)
    start = time.perf_counter()
    answers = [plain.generate(p, **setting).token_ids for p, setting in zip(ids, settings)]
    timed: dict[str, Any] = {"walls": {"plain": time.perf_counter() - start}}
    if not args.costs:  # priced elsewhere: only the acceptances are collected here
        rounds = time_rounds(args, fixed_run, heads, answers)
        timed.update({**rounds, "walls": {**timed["walls"], **rounds["walls"]}})

    forget_stored_answers(lookups.values())  # the store fills prompt by prompt, as the fixed run's did
    records = []
    for prompt, prompt_ids, answer in zip(prompts, ids, answers):
        runs = {name: lm_positions(d, prompt_ids, answer) for name, d in lms.items()}
        runs.update({name: head_positions(d, model, prompt_ids, answer) for name, (_, d) in heads.items()})
        confidence = lm_drafts(lms[args.causal_lm], prompt_ids, answer) if args.causal_lm else [[]] * len(answer)
        for d in lookups.values():
            d.begin_query(prompt_ids)
        positions = []
        for t in range(len(answer)):
            context = prompt_ids + answer[:t]
            proposed, ok = {}, {}
            for name, d in lookups.items():
                draft = d.propose(context, 8, DraftContext()).tokens
                proposed[name], ok[name] = len(draft), common_prefix_len(draft, answer[t:])
            positions.append({"proposed": proposed, "lookup_ok": ok,
                              "lm_ok": {name: run[t] for name, run in runs.items()},
                              "confidence": [round(c, 4) for c in confidence[t]]})
        for d in lookups.values():
            d.end_query(prompt_ids + answer, len(prompt_ids))
        records.append({"id": prompt.id, "domain": prompt.domain, "positions": positions})
    return {**timed, "causal_lm": args.causal_lm, "lms": [*lms, *heads], "prompts": records,
            "temperature": args.temperature}


def time_rounds(args: Any, fixed_run: Any, heads: dict[str, Any], answers: list[list[int]]) -> dict[str, Any]:
    """The rounds' costs from runs on the same prompts: suffix@8 (verification by tokens drafted),
    the reference rule (the causal LM's rounds beside the lookup) and each head on its own."""
    suffix_traces, suffix_answers, suffix_wall = fixed_run(["suffix"], "fixed", "suffix@8")
    assert suffix_answers == answers, "outputs differ from the target's own"
    if args.causal_lm is None:  # sampled: lookups only
        return {"verify": round_costs(suffix_traces), "lm_round": {}, "rounds": {},
                "measured_rounds_suffix8": sum(r.verify_s + r.policy_s + r.draft_s
                                               for t in suffix_traces for r in t[1:]),
                "walls": {"suffix@8": suffix_wall}}
    # LM rounds cost what they cost beside the lookup (their catch-up after its stretches included):
    # timed in the reference rule's runs (policy_ab.py: the suffix drafter's draft where it proposes,
    # else the LM's)
    lm_arm = f"{args.causal_lm}@4"
    lm_traces, lm_answers, lm_wall = fixed_run([f"zoo:{args.causal_lm}", "suffix"], "rule:on=suffix",
                                               f"suffix@8,{lm_arm}")
    assert suffix_answers == answers == lm_answers, "greedy outputs differ"
    verify = round_costs(suffix_traces)
    rounds = {}
    for name, (spec, _) in heads.items():  # a head's rounds, timed on their own: its drafting and the target's
        head_traces, head_answers, _ = fixed_run([spec], "fixed", f"{name}@4")
        assert head_answers == answers, "greedy outputs differ"
        rounds[name] = lm_round_costs(head_traces, f"{name}@4", verify)
    spent = lambda traces: sum(r.verify_s + r.policy_s + r.draft_s for t in traces for r in t[1:])
    return {"verify": verify, "lm_round": lm_round_costs(lm_traces, lm_arm, verify), "rounds": rounds,
            "measured_rounds_suffix8": spent(suffix_traces), "measured_rounds_rule": spent(lm_traces),
            "walls": {"suffix@8": suffix_wall, f"rule suffix@8,{lm_arm}": lm_wall}}


RULES = [Rule(m, h, k) for m in (1, 2, 3, 4) for h in (0.0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9) for k in (1, 2, 3, 4)]
PRICED_RULES = [PricedRule(c, h) for c in (1.0, 1.05, 1.1, 1.2, 1.5) for h in (0.0, 0.3, 0.5, 0.7)]
LOOKUP_RULES = [Rule(m, 0.0, 0) for m in range(1, 9)]  # the suffix proposal from m tokens on, else none


def evaluate(data: dict[str, Any], max_lm: int, calibration: Calibration | None = None) -> dict[str, Any]:
    """The bounds, the causal rules and the single drafters on one collection, in the same costs
    (the priced rules too, given a calibration)."""
    verify = {int(k): v for k, v in data["verify"].items()}
    lm = data["causal_lm"]
    lm_round = {int(k): v for k, v in data["lm_round"].items()}
    own = {name: {int(k): v for k, v in costs.items()} for name, costs in data.get("rounds", {}).items()}
    lm_round = {name: own.get(name, lm_round) for name in data["lms"]}  # the LMs share the generalist's costs
    totals: dict[str, float] = defaultdict(float)
    by_domain: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for record in data["prompts"]:
        positions = [Position(p["proposed"], p["lookup_ok"], p["lm_ok"], p["confidence"]) for p in record["positions"]]
        totals["tokens"] += len(positions)
        totals["plain"] += len(positions) * cost_of(verify, 0)
        totals["suffix@8"] += fixed_time(positions, verify, "suffix", 8)
        totals["pld@8"] += fixed_time(positions, verify, "pld", 8)
        totals["oracle: lookups"] += best_time(positions, verify, lm_round, [], 0)
        if lm is not None:
            totals[f"oracle: lookups + {lm}"] += best_time(positions, verify, lm_round, [lm], max_lm)
            totals["oracle: lookups + the best LM per prompt"] += min(
                best_time(positions, verify, lm_round, [name], max_lm) for name in data["lms"])
            totals["oracle: lookups + any LM, per round"] += best_time(positions, verify, lm_round, data["lms"],
                                                                       max_lm)
        singles_here = single_times(positions, verify, lm_round, data["lms"], max_lm)
        totals["oracle: the best single configuration per prompt"] += min(singles_here.values())
        for config, seconds in singles_here.items():
            totals[f"single {config}"] += seconds
            by_domain[record["domain"]][config] += seconds
        for rule in RULES if lm is not None else LOOKUP_RULES:
            totals[f"rule {rule.min_match}/{rule.confidence}/{rule.max_lm}"] += rule_time(
                positions, verify, lm_round, rule, lm)
        if calibration is not None and lm is not None:
            for priced in PRICED_RULES:
                totals[f"priced rule {priced.consult}/{priced.confidence}"] += priced_rule_time(
                    positions, verify, lm_round[lm], priced, calibration, lm)
    # the per-domain oracle: each domain's best single configuration in hindsight
    totals["oracle: the best single configuration per domain"] = sum(min(t.values()) for t in by_domain.values())
    singles = {k: v for k, v in totals.items() if k.startswith("single ")}
    best_single = min(singles, key=singles.__getitem__)
    totals[f"best single ({best_single.removeprefix('single ')})"] = singles[best_single]
    base = totals["suffix@8"]
    overall = best_single.removeprefix("single ")
    domains = {domain: {"best": min(t, key=t.__getitem__), "x_best_single": round(t[overall] / min(t.values()), 3)}
               for domain, t in by_domain.items()}
    return {"tokens": totals["tokens"], "domains": domains,
            "x_plain": {k: totals["plain"] / v for k, v in totals.items() if k not in ("tokens", "plain")},
            "x_suffix8": {k: base / v for k, v in totals.items() if k not in ("tokens", "plain")},
            "checks": {"suffix@8 model vs measured": base / data["measured_rounds_suffix8"],
                       **({"rule 1/0.0/4 model vs measured": totals["rule 1/0.0/4"] / data["measured_rounds_rule"]}
                          if "measured_rounds_rule" in data else {})}
            if "measured_rounds_suffix8" in data else {}}  # only where the rounds were timed on these prompts


def main() -> None:
    parser = dev_set_parser(__doc__, PER_DOMAIN, temperature=0.0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-lm", type=int, default=4,
                        help="longest LM draft the oracle may choose (LM rounds are timed at 4 tokens)")
    parser.add_argument("--causal-lm", default=None,
                        help="the LM drafter the causal rules draft with (default: the zoo's generalist)")
    parser.add_argument("--heads", nargs="*", default=[], metavar="SPEC",
                        help="white-box heads to add to the LM drafters (e.g. zoo:smollm2-eagle), timed on their own")
    parser.add_argument("--replay", default=None, metavar="JSON", help="evaluate a saved collection (--out's)")
    parser.add_argument("--costs", default=None, metavar="JSON",
                        help="price the rounds with this collection's timings (e.g. a short run on a quiet CPU)")
    parser.add_argument("--fit", default=None, metavar="JSON",
                        help="calibrate the priced rules on this collection's answers (e.g. the dev split's --out)")
    parser.add_argument("--seed", type=int, default=0, help="the run seed of sampled answers (lookups only)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    collected_with = vars(args)
    if args.replay:
        with open(args.replay) as handle:
            saved = json.load(handle)
        data, collected_with = saved["data"], saved["args"]
    else:
        data = collect(args)
    if args.costs:  # the acceptances of one collection priced with another's (quieter) timings
        with open(args.costs) as handle:
            priced = json.load(handle)["data"]
        data.update({key: priced[key] for key in ("verify", "lm_round", "rounds") if key in priced})
        for key in ("measured_rounds_suffix8", "measured_rounds_rule"):
            data.pop(key, None)
    calibration = None
    if args.fit and data["causal_lm"] is not None:
        with open(args.fit) as handle:
            calibration = Calibration.fit(json.load(handle)["data"]["prompts"], data["causal_lm"])
    result = evaluate(data, args.max_lm, calibration)
    best = max((k for k in result["x_plain"] if k.startswith("rule")), key=result["x_plain"].get)
    print(json.dumps({k: round(v, 3) for k, v in result["x_plain"].items()
                      if not k.startswith(("rule", "single", "priced rule"))}, indent=1))
    priced = {k: round(v, 3) for k, v in result["x_plain"].items() if k.startswith("priced rule")}
    if priced:
        print("priced rules (consult below × a plain round's rate / the LM's stop):", json.dumps(priced))
    per_drafter: dict[str, tuple[str, float]] = {}
    for key, value in result["x_plain"].items():
        if key.startswith("single "):
            name = key.removeprefix("single ").rsplit("@", 1)[0]
            per_drafter[name] = max(per_drafter.get(name, (key, 0.0)), (key, value), key=lambda kv: kv[1])
    print("each drafter at its best length:", {k: (v[0].removeprefix("single "), round(v[1], 3))
                                              for k, v in per_drafter.items()})
    print("per domain (its best single configuration, and its speed over the overall best single's):",
          json.dumps(result["domains"]))
    print("best rule", best, round(result["x_plain"][best], 3), "checks (model ÷ measured):",
          {k: round(v, 3) for k, v in result["checks"].items()})
    with open(args.out, "w") as handle:
        json.dump({"result": result, "data": data, "args": {**collected_with, "fit": args.fit},
                   **({"priced_with": args.costs} if args.costs else {})}, handle)


if __name__ == "__main__":
    main()
