"""``benchmarks/batch_ab.py`` (the bench with its A/B switches) with every step the batched engine's
cost model observes logged to ``$OUT/steps.jsonl`` (default /tmp): requests R, draft tokens D,
seconds, the fitted (a, b, c) after it, and whether the draft-token cost counts as known. A
``{"run": METHOD, "B": ..., "max_new": ...}`` line opens each run (warm-ups are the short ones).
Written to find why the load cap stopped all drafting on an H200 (NOTES, session 15):

    OUT=runs/probe python benchmarks/step_probe.py bench --out runs/probe/b32 --batch-size 32 \\
        --per-domain 8 --repeats 1 --methods ar,fixed:suffix@8,default [--device cuda]
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import batch_ab

from draftwise import step_costs
from draftwise.bench import batched
from draftwise.cli import main

_observe = step_costs.StepCostModel.observe
_build = batch_ab._build_runner
_running: dict[str, Any] = {"method": None}
LOG = os.path.join(os.environ.get("OUT", "/tmp"), "steps.jsonl")


def _log(line: dict[str, Any]) -> None:
    with open(LOG, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")


def _observe_logged(self: step_costs.StepCostModel, shape: step_costs.StepShape) -> bool:
    taken = _observe(self, shape)
    _log({"m": _running["method"], "R": shape.requests, "D": shape.draft_tokens, "s": round(shape.seconds, 6),
          "ok": taken, "coef": [float(f"{c:.3e}") for c in self.coef[:3]], "known": self.draft_cost_known})
    return taken


def _build_logged(bench: Any, spec: str, length_drafter: str) -> Any:
    inner = _build(bench, spec, length_drafter)

    def run(prompts: Any, batch: int, max_new: int) -> Any:
        _running["method"] = spec
        _log({"run": spec, "B": batch, "max_new": max_new})
        return inner(prompts, batch, max_new)

    return run


if __name__ == "__main__":
    os.makedirs(os.path.dirname(LOG), exist_ok=True)
    open(LOG, "w").close()  # one probe's steps per file
    step_costs.StepCostModel.observe = _observe_logged  # type: ignore[method-assign]
    batch_ab.batch.BatchEngine.__init__ = batch_ab._engine_init  # type: ignore[method-assign]
    batch_ab.batch.BatchEngine._unaffordable = batch_ab._engine_unaffordable  # type: ignore[method-assign]
    batched.build_runner = _build_logged
    main(sys.argv[1:])
