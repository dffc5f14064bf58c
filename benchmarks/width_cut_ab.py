"""A/B of the padded-width cut (session 13): ``draftwise bench`` in which a method named
``METHOD~nocut`` runs METHOD with ``BatchEngine(cut_width=False)``, in the same process and
interleaved with the others.

    DRAFTWISE_DATA=../shared/data python benchmarks/width_cut_ab.py bench --out runs/cut --batch-size 8,16,32 \\
        --per-domain 4 --repeats 2 --threads 1 --methods ar,default,default~nocut,fixed:suffix,fixed:suffix~nocut
"""

from __future__ import annotations

import sys
from typing import Any

from draftwise.bench import batched
from draftwise.cli import main
from draftwise.engine import batch

NOCUT = "~nocut"
_cut = {"on": True}
_init = batch.BatchEngine.__init__
_build = batched.build_runner


def _engine_init(self: Any, *args: Any, **kwargs: Any) -> None:
    _init(self, *args, **kwargs)
    self.cut_width = _cut["on"]


def _build_runner(bench: Any, spec: str, length_drafter: str) -> Any:
    if not spec.endswith(NOCUT):
        return _build(bench, spec, length_drafter)
    inner = _build(bench, spec[: -len(NOCUT)], length_drafter)

    def run(*args: Any, **kwargs: Any) -> Any:
        _cut["on"] = False
        try:
            return inner(*args, **kwargs)
        finally:
            _cut["on"] = True

    return run


if __name__ == "__main__":
    batch.BatchEngine.__init__ = _engine_init  # type: ignore[method-assign]
    batched.build_runner = _build_runner
    main(sys.argv[1:])
