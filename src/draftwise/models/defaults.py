"""Which target and drafter pool are used when none is named.

The default target is the real SmolLM2-135M-Instruct (``smollm2``, fetched once into the local
cache); its pool is every zoo drafter distilled for it plus the two lookups. The toy zoo target
(``zoo:target``) keeps its own pool, for tests and quick experiments. Any other target gets no
drafters unless they are named: a drafter must speak the target's vocabulary.
"""

from __future__ import annotations

from draftwise.models.named_models import is_named_model
from draftwise.zoo.load import TOY_TARGET

DEFAULT_TARGET = "smollm2"
LOOKUPS = ("pld", "suffix")
ZOO_POOL = ("zoo:all", *LOOKUPS)  # zoo:all: the zoo drafters that speak the target's vocabulary


def default_drafters(target: str) -> tuple[str, ...]:
    """The drafter specs used with ``target`` when none are given."""
    return ZOO_POOL if target == TOY_TARGET or is_named_model(target) else ()
