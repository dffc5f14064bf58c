"""One query's request: checked where it enters (the API, the CLI, the server, the bench).

Every check raises :class:`~draftwise.errors.DraftwiseError` with one clear message, before any work.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from draftwise.errors import DraftwiseError
from draftwise.verify.chain import Sampling, sampling_settings

SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes seeds below 2**64; numpy's generators refuse negatives


def check_seed(seed: Any, name: str = "seed") -> int:
    """A seed every generator accepts: an integer in [0, 2**64)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < SEED_LIMIT:
        raise DraftwiseError(f"{name} must be an integer in [0, 2**64), got {seed!r}")
    return int(seed)


def check_prompt_text(text: str, where: str = "the prompt") -> str:
    """Text the tokenizer can encode: no lone surrogates (undecodable bytes smuggled in by
    Python's surrogateescape, or a JSON ``\\udcff`` escape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise DraftwiseError(f"{where} is not valid Unicode text (undecodable character {text[error.start]!r} at "
                             f"position {error.start}); pass UTF-8 text") from None
    return text


def _check_sampling(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None) -> Sampling:
    # NaN fails every comparison, so each check is written as "ok" and negated.
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens <= 0:
        raise DraftwiseError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if not (isinstance(temperature, numbers.Real) and math.isfinite(temperature) and temperature >= 0):
        raise DraftwiseError(f"temperature must be ≥ 0 and finite (0 = greedy), got {temperature!r}")
    if top_p is not None and not (isinstance(top_p, numbers.Real) and 0 < top_p <= 1):
        raise DraftwiseError(f"top_p must lie in (0, 1], got {top_p!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1):
        raise DraftwiseError(f"top_k must be an integer ≥ 1, got {top_k!r}")
    return sampling_settings(float(temperature), None if top_k is None else int(top_k),
                             None if top_p is None else float(top_p))


def check_generate_args(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None,
                        seed: int | None) -> Sampling:
    """Every numeric argument of :meth:`~draftwise.api.Generator.generate`, checked before any work (the CLI
    calls it before loading models); returns the sampling settings."""
    if seed is not None:
        check_seed(seed)
    return _check_sampling(max_new_tokens, temperature, top_k, top_p)
