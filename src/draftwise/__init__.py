"""draftwise: lossless speculative decoding with a pool of drafters chosen online."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["DraftwiseError", "GenerationResult", "Generator", "Request", "Setup", "__version__"]

from draftwise.errors import DraftwiseError
from draftwise.request import Request

if TYPE_CHECKING:
    from draftwise.api import Generator
    from draftwise.decision.setup import Setup
    from draftwise.trace import GenerationResult


def __getattr__(name: str) -> Any:
    # torch and transformers load only when the engine is used, so `draftwise sim --help` is quick.
    if name == "Generator":
        from draftwise.api import Generator

        return Generator
    if name == "Setup":
        from draftwise.decision.setup import Setup

        return Setup
    if name == "GenerationResult":
        from draftwise.trace import GenerationResult

        return GenerationResult
    raise AttributeError(name)
