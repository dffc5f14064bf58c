"""A/B of the batched engine's switches: ``draftwise bench`` in which a method's suffix turns one
``BatchEngine`` switch off, in the same process and interleaved with the others:

- ``METHOD~nocut``: ``cut_width`` (the padded-width cut, session 13);
- ``METHOD~rowprefill``: ``share_prefill`` (each joining prompt its own forward, as before session 14);
- ``METHOD~noscout``: ``scout_models`` (any number of lanes may try a model arm in a round while its
  cost is unknown, as before session 14);
- ``METHOD~grow``: ``reserve_at_join`` (the KV buffers grow by doubling when a forward needs room,
  as before session 14, instead of being sized at the join).

A new switch is one more entry in ``SWITCHES``.

    DRAFTWISE_DATA=../shared/data python benchmarks/batch_ab.py bench --out runs/ab --batch-size 8,16,32 \\
        --per-domain 4 --repeats 2 --threads 1 --methods ar,default,default~nocut,fixed:suffix,fixed:suffix~nocut
"""

from __future__ import annotations

import sys
from typing import Any

from draftwise.bench import batched
from draftwise.cli import main
from draftwise.engine import batch

SWITCHES = {"~nocut": "cut_width", "~rowprefill": "share_prefill", "~noscout": "scout_models",
            "~grow": "reserve_at_join"}
_off: set[str] = set()  # the switches the running method turns off
_init = batch.BatchEngine.__init__
_build = batched.build_runner


def _engine_init(self: Any, *args: Any, **kwargs: Any) -> None:
    _init(self, *args, **kwargs)
    for attribute in _off:
        setattr(self, attribute, False)


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
    batched.build_runner = _build_runner
    main(sys.argv[1:])
