"""``draftwise policies``: every registered policy with its one-line summary and option defaults."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "policies",
        help="list the policies (learners) with their options and defaults",
        description="List every registered policy. Use one as NAME or NAME:key=value,key=value.",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from draftwise.feedback import LOSSES, SIGNALS
    from draftwise.policies import POLICIES, policy_options

    for name, factory in POLICIES.items():
        summary = getattr(factory, "summary", "") or (factory.__doc__ or "").strip().splitlines()[0]
        print(f"{name}: {summary}")
        options = policy_options(name)
        if options:
            print("    " + ", ".join(f"{key}={value!r}" for key, value in options.items()))
    print()
    print("bandit reward signals (reward=NAME or NAME:key=value): " + ", ".join(SIGNALS))
    print("full-information losses (loss=NAME): " + ", ".join(LOSSES))
    return 0
