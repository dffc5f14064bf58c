"""``draftwise sim``: run learners on a paper-calibrated synthetic drafter pool (no models)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from typing import Any

from draftwise.errors import DraftwiseError
from draftwise.request import SEED_LIMIT
from draftwise.sim.runner import simulate
from draftwise.sim.scenarios import SCENARIOS, get_scenario


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sim",
        help="simulate learners on paper-calibrated drafter pools (no models needed)",
        description="Run policies on synthetic queries calibrated on the papers' tables and compare "
        "them with the best fixed drafter per domain in hindsight. See docs/simulator.md.",
    )
    parser.add_argument("--scenario", help="scenario name (see --list)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument(
        "--policies",
        help="comma-separated policy specs, e.g. 'ucb,ucb:reward=be,normalhedge' (an item key=value "
        "without ':' continues the previous spec); default: the scenario's",
    )
    parser.add_argument("--seeds", type=int, default=10, help="seeds (repetitions); mean ± std over them (default 10)")
    parser.add_argument("--first-seed", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--queries", type=int, help="queries per seed (default: the scenario's)")
    parser.add_argument("--tokens", type=int, help="fixed response length B in tokens (default: log-normal lengths)")
    parser.add_argument("--median-tokens", type=float, help="median of the log-normal response lengths")
    parser.add_argument("--rho", type=float,
                        help="Markov persistence of acceptance probabilities between positions (default 0)")
    parser.add_argument("--kappa", type=float, help="Beta concentration of acceptance probabilities (default 2)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run)


def split_policies(text: str) -> list[str]:
    """Split a policy list on commas; ``key=value`` items without ':' belong to the previous spec.

    >>> split_policies("ucb:beta=0.1,reward=be,normalhedge")
    ['ucb:beta=0.1,reward=be', 'normalhedge']
    """
    specs: list[str] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        if "=" in item and ":" not in item:
            if not specs:
                raise DraftwiseError(f"--policies: option {item!r} comes before any policy name")
            specs[-1] += "," + item
        else:
            specs.append(item)
    return specs


def run(args: argparse.Namespace) -> int:
    if args.list:
        for name in SCENARIOS:
            scenario = get_scenario(name)
            print(f"{name:22s} {len(scenario.arms):3d} drafters  {scenario.description}")
        return 0
    if not args.scenario:
        raise DraftwiseError("give --scenario NAME (or --list to see them)")
    check_numbers(args)
    scenario = get_scenario(args.scenario)
    if args.rho is not None:
        scenario = dataclasses.replace(scenario, rho=args.rho)
    if args.kappa is not None:
        scenario = dataclasses.replace(scenario, kappa=args.kappa)
    policies = split_policies(args.policies) if args.policies else None
    result = simulate(scenario, policies, seeds=args.seeds, queries=args.queries, tokens=args.tokens,
                      median_tokens=args.median_tokens, first_seed=args.first_seed)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_table(result))
    return 0


def check_numbers(args: argparse.Namespace) -> None:
    """Each numeric option states what is valid (written as "ok" tests: NaN fails every comparison)."""
    checks = [
        (args.seeds >= 1, f"--seeds must be ≥ 1, got {args.seeds}"),
        (args.first_seed >= 0 and args.first_seed + args.seeds <= SEED_LIMIT,
         f"--first-seed must be ≥ 0 (and the last seed below 2**64), got {args.first_seed}"),
        (args.queries is None or args.queries >= 1, f"--queries must be ≥ 1, got {args.queries}"),
        (args.tokens is None or args.tokens >= 1, f"--tokens must be ≥ 1, got {args.tokens}"),
        (args.median_tokens is None or (math.isfinite(args.median_tokens) and args.median_tokens > 0),
         f"--median-tokens must be a finite number > 0, got {args.median_tokens}"),
        (args.rho is None or 0.0 <= args.rho < 1.0, f"--rho must be in [0, 1), got {args.rho}"),
        (args.kappa is None or (math.isfinite(args.kappa) and args.kappa > 0),
         f"--kappa must be a finite number > 0, got {args.kappa}"),
    ]
    for ok, message in checks:
        if not ok:
            raise DraftwiseError(message)


def format_table(result: dict[str, Any]) -> str:
    """A readable table: one line per policy, mean ± std over seeds."""
    tokens = result["tokens"]
    if isinstance(tokens, int):
        length = f"B = {tokens}"
    else:
        length = f"log-normal lengths, median {tokens['median']:g}, cap {tokens['max']}"
    oracle = result["oracle"]
    lines = [
        f"scenario {result['scenario']}: {result['seeds']} seeds × {result['queries']} queries, {length}",
        f"oracle (best fixed drafter per domain in hindsight): MAT {oracle['mat']:.3f} ± {oracle['mat_std']:.3f}",
        "",
        f"{'policy':32s} {'MAT':>15s} {'calls/query':>12s} {'regret':>15s} "
        f"{'best-arm':>9s} {'best@50':>8s} {'speedup':>14s}",
    ]
    for name, m in result["policies"].items():
        lines.append(
            f"{name:32s} {m['mat']:7.3f} ± {m['mat_std']:5.3f} {m['target_calls']:12.1f} "
            f"{m['regret']:7.2f} ± {m['regret_std']:5.2f} {m['best_arm_ratio']:9.3f} {m['best_arm_ratio_50']:8.3f} "
            f"{m['speedup']:6.3f} ± {m['speedup_std']:5.3f}"
        )
    lines.append("")
    lines.append("regret: rounds (target calls) per query beyond the oracle drafter's; best-arm: share of rounds "
                 "on the domain's best drafter (best@50: in each query's first 50 rounds)")
    return "\n".join(lines)
