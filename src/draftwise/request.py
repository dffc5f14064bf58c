"""One query's request — how many tokens, how to sample, when to stop — checked where it enters.

The API, the CLI, the server and the bench build a :class:`Request`; everything past them takes it as
it is. A bad value raises :class:`~draftwise.errors.DraftwiseError` with one clear message, before any work::

    >>> Request(max_new_tokens=32, temperature=0.7, stop=["\\n\\n"]).stop
    ('\\n\\n',)
    >>> Request(top_p=1.5)
    Traceback (most recent call last):
    ...
    draftwise.errors.DraftwiseError: top_p must lie in (0, 1], got 1.5
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from draftwise.errors import DraftwiseError

NUL = "\0"
SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes seeds below 2**64; numpy's generators refuse negatives


@dataclass(frozen=True)
class Request:
    """What one query asks for (the generation settings of :meth:`~draftwise.api.Generator.generate`)."""

    max_new_tokens: int = 128
    temperature: float = 0.0  # 0 (or below draftwise.verify.chain.GREEDY_BELOW): greedy
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None  # None: the Generator's seed
    stop: tuple[str, ...] = ()  # stop strings: the answer ends through the first one it completes
    ignore_eos: bool = False  # generate past end-of-sequence tokens
    truncate: bool = False  # shorten a prompt too long for the target's context (the end of its text is kept)

    def __post_init__(self) -> None:
        if self.seed is not None:
            object.__setattr__(self, "seed", check_seed(self.seed))
        check_sampling(self.max_new_tokens, self.temperature, self.top_k, self.top_p)
        object.__setattr__(self, "max_new_tokens", int(self.max_new_tokens))
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_k", None if self.top_k is None else int(self.top_k))
        object.__setattr__(self, "top_p", None if self.top_p is None else float(self.top_p))
        object.__setattr__(self, "stop", check_stops(self.stop))


# What other APIs call a Request's fields (OpenAI, transformers' generate): the answer to such a keyword names ours.
KEYWORD_ALIASES = {"max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens",
                   "stop_strings": "stop", "stop_sequences": "stop"}


def make_request(request: Request | None = None, settings: Mapping[str, Any] | None = None) -> Request:
    """The request a call asks for: ``request`` (default: every field's default), with ``settings`` — a
    Request's fields as keywords — over it. An unknown keyword is one clear error naming the valid ones."""
    settings = dict(settings or {})
    valid = [f.name for f in fields(Request)]
    unknown = [name for name in settings if name not in valid]
    if unknown:
        name = unknown[0]
        guess = KEYWORD_ALIASES.get(name) or next(iter(difflib.get_close_matches(name, valid, n=1, cutoff=0.75)), None)
        hint = f"did you mean {guess}? " if guess else ""
        raise DraftwiseError(f"unknown generation setting {name!r}; {hint}valid: {', '.join(valid)}")
    if request is None:
        return Request(**settings)
    return replace(request, **settings) if settings else request


def check_seed(seed: Any, name: str = "seed") -> int:
    """A seed every generator accepts: an integer in [0, 2**64)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < SEED_LIMIT:
        raise DraftwiseError(f"{name} must be an integer in [0, 2**64), got {seed!r}")
    return int(seed)


def check_sampling(max_new_tokens: Any, temperature: Any, top_k: Any, top_p: Any) -> None:
    """The length and sampling settings of a request (one clear error for the first bad one)."""
    # NaN fails every comparison, so each check is written as "ok" and negated.
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or int(max_new_tokens) <= 0:
        raise DraftwiseError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if not (isinstance(temperature, numbers.Real) and math.isfinite(temperature) and float(temperature) >= 0):
        raise DraftwiseError(f"temperature must be ≥ 0 and finite (0 = greedy), got {temperature!r}")
    if top_p is not None and not (isinstance(top_p, numbers.Real) and 0 < float(top_p) <= 1):
        raise DraftwiseError(f"top_p must lie in (0, 1], got {top_p!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or int(top_k) < 1):
        raise DraftwiseError(f"top_k must be an integer ≥ 1, got {top_k!r}")


def check_stops(stop: Any) -> tuple[str, ...]:
    """Stop strings as a tuple (one string alone is one stop string); each must be non-empty text, since an
    empty one would end every answer after its first token."""
    try:
        stops = (stop,) if isinstance(stop, str) else tuple(stop)
    except TypeError:
        raise DraftwiseError(f"stop must be a string or a list of strings, got {stop!r}") from None
    if not all(isinstance(s, str) for s in stops):
        raise DraftwiseError(f"stop must be a string or a list of strings, got {stop!r}")
    if not all(stops):
        raise DraftwiseError(f"stop strings must not be empty (an empty one matches at once), got {stop!r}; "
                             "pass text such as \"\\n\\n\", or no stop string")
    return stops


def check_prompt_text(text: str, where: str = "the prompt") -> str:
    """Text the tokenizer can encode: no lone surrogates (undecodable bytes smuggled in by
    Python's surrogateescape, or a JSON ``\\udcff`` escape), and no NUL characters (tokenizers drop
    them without a word, so the model would answer another prompt than the one sent)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise DraftwiseError(f"{where} is not valid Unicode text (undecodable character {text[error.start]!r} at "
                             f"position {error.start}); pass UTF-8 text") from None
    if NUL in text:
        raise DraftwiseError(f"{where} contains a NUL character (\\x00) at position {text.index(NUL)}; "
                             "pass text without NUL bytes")
    return text

