"""``draftwise costs``: what the target's forwards cost on this machine, as the decisions price them."""

from __future__ import annotations

import argparse
import json
from typing import Any

from draftwise.models.defaults import DEFAULT_TARGET
from draftwise.models.numerics_modes import AUTO, NUMERICS_CHOICES, NUMERICS_HELP


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "costs",
        help="show what the target's forwards cost on this machine",
        description="Show the target's cost curve on this machine: a forward over 1-16 new tokens of one query "
        "(what verifying a draft costs next to a plain step) and a batch's plain step of 1-16 rows. It is measured "
        "at a target's first load on each CPU, thread count and numerics (a few seconds), kept in the draftwise "
        "home, and refined by the rounds the engine times; a batch's step costs start from it.",
    )
    p.add_argument("--target", default=None, help="target model (default smollm2); as for 'draftwise generate'")
    p.add_argument("--numerics", default=AUTO, choices=NUMERICS_CHOICES, help=NUMERICS_HELP)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--measure", action="store_true", help="measure again, replacing the kept curve")
    p.add_argument("--json", action="store_true", help="print the curve as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # torch and the models load only for a command that runs (seconds)
    import torch

    from draftwise.cli.generate import check_threads
    from draftwise.models.costs import curve_path, target_costs
    from draftwise.models.loading import LoadOptions, load_target

    if args.threads is not None:
        torch.set_num_threads(check_threads(args.threads))
    target = args.target or DEFAULT_TARGET
    model, _, _ = load_target(target, LoadOptions(device=args.device, numerics=args.numerics))
    curve = target_costs(model, measure_again=args.measure)
    summary = curve.summary()
    if args.json:
        print(json.dumps(summary))
        return 0
    print(format_curve(target, summary, str(curve_path(curve.key))))
    return 0


def format_curve(target: str, summary: dict[str, Any], path: str) -> str:
    key = summary["machine"]
    isa = " ".join(key["isa"]) or "no AVX2 or AVX-512"
    forward, relative, steps = summary["forward_ms"], summary["relative"], summary["batch_step_ms"]

    def row(label: str, values: list[str]) -> str:
        return f"{label:<13}" + "".join(f"{v:>8}" for v in values)

    lines = [
        f"{target} in {key['numerics']} on {key['device']}: {key['cpu']} ({key['capability']}; {isa}), "
        f"{key['threads']} thread(s), torch {key['torch']}",
        f"measured in {summary['measure_s']:.1f} s; kept in {path}",
        "",
        "one query: a forward over k new tokens (k - 1 drafted), after 200 cached",
        row("k", [str(k) for k in forward]),
        row("ms", [f"{v:.2f}" for v in forward.values()]),
        row("x plain step", [f"{v:.2f}" for v in relative.values()]),
        "",
        "a batch: one plain step of b rows",
        row("b", [str(b) for b in steps]),
        row("ms", [f"{v:.2f}" for v in steps.values()]),
        row("ms per row", [f"{v / int(b):.2f}" for b, v in steps.items()]),
    ]
    return "\n".join(lines)
