"""``draftwise policies``: every registered policy with its one-line summary and option defaults."""

from __future__ import annotations

import argparse

from draftwise.policies import POLICIES, PRESETS, policy_options
from draftwise.policies.feedback import LOSSES, SIGNALS


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "policies",
        help="list the policies (learners) with their options and defaults",
        description="List every registered policy and paper preset. Use one as NAME or NAME:key=value,key=value "
        "(e.g. --policy hedgespec:warmup=4). Presets also set the arm layout (override it with --arms).",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # the engine loads torch and transformers (seconds): imported when the command runs, not for its parser
    from draftwise.api import DEFAULT_POLICY
    from draftwise.decision.arms import LAYOUTS
    from draftwise.drafters import STOP_RULES

    for name, factory in POLICIES.items():
        summary = getattr(factory, "summary", "") or (factory.__doc__ or "").strip().splitlines()[0]
        print(f"{name}: {summary}")
        options = policy_options(name)
        if options:
            print("    " + ", ".join(f"{key}={value!r}" for key, value in options.items()))
    print()
    print("paper presets (policy + arm layout):")
    for name, preset in PRESETS.items():
        print(f"{name}: {preset.summary}")
        settings = ", ".join(f"{k}={v}" for k, v in (("arms", preset.arms), ("max_draft", preset.max_draft),
                                                      ("draft_len", preset.draft_len)) if v is not None)
        print(f"    = {preset.policy}:" + ",".join(f"{k}={v}" for k, v in preset.options.items()) + f"; {settings}")
    print()
    print(f"default policy: {DEFAULT_POLICY}")
    print("arm layouts (--arms): " + ", ".join(LAYOUTS) + ", or a list like code@6+svip,pld@3,none")
    print("stopping rules (--stops): " + ", ".join(STOP_RULES))
    print("bandit reward signals (reward=NAME or NAME:key=value): " + ", ".join(SIGNALS))
    print("full-information losses (loss=NAME): " + ", ".join(LOSSES))
    return 0
