"""The embedded model zoo: a small Llama target and domain-specialist drafters
(trained by :mod:`draftwise.training`; this package only finds them by name).

Load by name (``zoo:target``, ``zoo:code``, …; ``zoo:all`` = every zoo drafter)::

    from draftwise.zoo import resolve_zoo_name, expand_zoo_names
    path = resolve_zoo_name("zoo:target")  # a standard HF checkpoint folder

Build with ``draftwise zoo build``; see docs/zoo.md.
"""

from draftwise.zoo.load import (
    ALL,
    expand_zoo_names,
    is_zoo_name,
    resolve_zoo_name,
    shipped_models_dir,
    zoo_domain_of,
    zoo_drafter_names,
    zoo_entries,
    zoo_head_names,
    zoo_names,
    zoo_target_of,
)

__all__ = [
    "ALL",
    "expand_zoo_names",
    "is_zoo_name",
    "resolve_zoo_name",
    "shipped_models_dir",
    "zoo_domain_of",
    "zoo_drafter_names",
    "zoo_entries",
    "zoo_head_names",
    "zoo_names",
    "zoo_target_of",
]
