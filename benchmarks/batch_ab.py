"""A/B of the batched engine's switches: ``draftwise bench`` in which a method's suffix turns one
``BatchEngine`` switch off, in the same process and interleaved with the others:

- ``METHOD~nocut``: ``cut_width`` (no padded-width cut);
- ``METHOD~rowprefill``: ``share_prefill`` (each joining prompt its own forward);
- ``METHOD~noscout``: ``scout_models`` (any number of lanes may try a model arm in a round while its
  cost is unknown);
- ``METHOD~grow``: ``reserve_at_join`` (the KV buffers grow by doubling when a forward needs room,
  instead of being sized at the join);
- ``METHOD~nocap``: ``cap_acceptance`` (no load cap on per-query drafts);
- ``METHOD~nocredit``: ``credit_plain`` (lanes not told what ``none`` would have earned);
- ``METHOD~nomodels``: no lane ever plays a model-drafter arm (lookups only);
- ``METHOD~trustprior``: the load cap and width cut trust the step-cost model's prior from the first
  step, instead of probing until a draft token's cost is measured;
- ``METHOD~median``: ``mean_model_cost`` (a model arm's cost per token is the median of its recent
  rounds, not their mean: lanes' first plays left out);
- ``METHOD~ownmodelcost``: each session measures a model drafter's token cost afresh, instead of
  sharing it with the generator's other sessions (its step costs);
- ``METHOD~nogate``: ``gate`` (every round drafts, also at a load where what the admitted tokens
  earn has not paid for the lanes' drafting and choosing).

The latest A/B of each: BENCHMARKS.md, "Batched engine".

A new switch is one more entry in ``SWITCHES``.

    DRAFTWISE_DATA=../shared/data python benchmarks/batch_ab.py bench --out runs/ab --batch-size 8,16,32 \\
        --per-domain 4 --repeats 2 --threads 1 --methods ar,default,default~nocut,fixed:suffix,fixed:suffix~nocut
"""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import replace
from typing import Any

from draftwise.bench import batched
from draftwise.cli import main
from draftwise.decision.core import Limits
from draftwise.decision.step_costs import StepCostModel, StepShape, length_cap
from draftwise.engine import batch

SWITCHES = {"~nocut": "cut_width", "~rowprefill": "share_prefill", "~noscout": "scout_models",
            "~grow": "reserve_at_join", "~nocap": "cap_acceptance", "~nocredit": "credit_plain",
            "~nomodels": "models", "~trustprior": "probe", "~median": "mean_model_cost",
            "~ownmodelcost": "shared_model_cost", "~nogate": "gate"}
_off: set[str] = set()  # the switches the running method turns off
_init = batch.BatchEngine.__init__
_build = batched.build_runner
_limits = batch.BatchEngine._limits


class _TrustPrior(StepCostModel):
    def observe(self, shape: StepShape) -> bool:
        taken = super().observe(shape)
        self.draft_cost_known = True
        return taken

    def cap(self, requests: int, max_len: int, acceptance: float, token_s: float = 0.0) -> int:
        return length_cap(self.coef, requests, max_len, acceptance, token_s)


def _engine_init(self: Any, *args: Any, **kwargs: Any) -> None:
    _init(self, *args, **kwargs)
    for attribute in _off - {"models", "probe", "shared_model_cost", "gate"}:
        setattr(self, attribute, False)
    if "gate" in _off:
        self.gate = None
    if "shared_model_cost" in _off:
        self.model_token_s = deque(maxlen=self.model_token_s.maxlen)
    if "probe" in _off:
        self.costs = _TrustPrior()
        self.costs.draft_cost_known = True


def _engine_limits(self: Any, requests: int) -> Limits:
    limits = _limits(self, requests)
    return replace(limits, blocked=limits.blocked | self.book.models) if "models" in _off else limits


def _build_runner(bench: Any, spec: str, length_drafter: str) -> Any:
    suffix = next((s for s in SWITCHES if spec.endswith(s)), None)
    if suffix is None:
        return _build(bench, spec, length_drafter)
    inner = _build(bench, spec[: -len(suffix)], length_drafter)

    def run(*args: Any, **kwargs: Any) -> Any:
        _off.add(SWITCHES[suffix])
        try:
            return inner(*args, **kwargs)
        finally:
            _off.clear()

    return run


if __name__ == "__main__":
    batch.BatchEngine.__init__ = _engine_init  # type: ignore[method-assign]
    batch.BatchEngine._limits = _engine_limits  # type: ignore[method-assign]
    batched.build_runner = _build_runner
    main(sys.argv[1:])
