"""Parsing of ``name:key=value,key=value`` specs used for policies, drafters and presets."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from draftwise.errors import DraftwiseError


def split_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``"ucb:beta=0.1,reward=bd"`` into ``("ucb", {"beta": "0.1", "reward": "bd"})``.

    >>> split_spec("pld:max_ngram=4")
    ('pld', {'max_ngram': '4'})
    >>> split_spec("round-robin")
    ('round-robin', {})
    """
    name, _, rest = spec.partition(":")
    options: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise DraftwiseError(f"bad option {item!r} in {spec!r}: expected key=value")
        options[key.strip()] = value.strip()
    return name.strip(), options


def parse_value(text: str, default: Any) -> Any:
    """Convert an option string to the type of its default (bool, int, float, str, or None → guess)."""
    if isinstance(default, bool):
        lowered = text.lower()
        if lowered in {"1", "true", "yes", "on"}:
            return True
        if lowered in {"0", "false", "no", "off"}:
            return False
        raise ValueError(f"expected a boolean, got {text!r}")
    if isinstance(default, int):
        return int(text)
    if isinstance(default, float):
        return float(text)
    if default is None:
        for convert in (int, float):
            try:
                return convert(text)
            except ValueError:
                pass
        if text.lower() in {"none", "null"}:
            return None
    return text


def keyword_defaults(factory: Callable[..., Any], skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The keyword parameters of ``factory`` with their defaults (what a spec may override)."""
    params = inspect.signature(factory).parameters
    return {
        name: p.default
        for name, p in params.items()
        if name not in skip
        and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        and p.default is not inspect.Parameter.empty
    }


def typed_options(owner: str, raw: dict[str, str], defaults: dict[str, Any]) -> dict[str, Any]:
    """Validate ``raw`` against ``defaults``: unknown keys and unparsable values raise one clear error."""
    typed: dict[str, Any] = {}
    for key, text in raw.items():
        if key not in defaults:
            valid = ", ".join(sorted(defaults)) or "none"
            raise DraftwiseError(f"unknown option {key!r} for {owner}; valid options: {valid}")
        try:
            typed[key] = parse_value(text, defaults[key])
        except ValueError as exc:
            raise DraftwiseError(f"option {key}={text!r} for {owner}: {exc}") from None
    return typed
