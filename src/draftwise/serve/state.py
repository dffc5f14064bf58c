"""The learner's state in a file (``draftwise serve --state FILE``): loaded at start, saved on shutdown.

JSON, never pickle: loading a file runs no code. It holds a format name and version, the policy spec and
class, the arm names, and every attribute of the policy object (nested learners included) encoded by type:
numpy arrays with their dtype, tuples, deques, dicts with any keys (ctx-ucb keys its contexts by tuples).
A file from another policy or another arm layout is refused with what it holds and what the server runs.
The random generator is not saved (each request seeds its own) and functions are rebuilt, not stored.

Nested objects are rebuilt only from classes defined in ``draftwise.policies`` (the learners and their
helpers); any other class name in a file is an error.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import tempfile
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from draftwise.errors import DraftwiseError

log = logging.getLogger(__name__)

FORMAT = "draftwise-learner-state"
VERSION = 1
NOT_SAVED = ("rng", "_signal")  # a policy's random generator (seeded per request) and its reward function
SAFE_MODULES = "draftwise.policies."


def save_state(path: str | Path, policy: Any, policy_spec: str) -> None:
    """Write ``policy``'s state to ``path`` atomically (a temporary file, then a rename)."""
    document = {
        "format": FORMAT, "version": VERSION, "policy": policy_spec, "class": _class_name(policy),
        "arms": list(policy.arms), "state": _encode_object(policy),
    }
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(document, fh)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_state(path: str | Path, policy: Any, policy_spec: str) -> bool:
    """Restore ``policy`` from ``path``; False when there is no file yet (see :func:`read_state`,
    :func:`apply_state`)."""
    document = read_state(path)
    if document is None:
        return False
    apply_state(document, path, policy, policy_spec)
    return True


def read_state(path: str | Path) -> dict[str, Any] | None:
    """The state file's document, checked for format and version (before any model loads); None when
    there is no file yet. A file that is not a learner state is a :class:`DraftwiseError` saying so."""
    where = f"--state {path}"
    target = Path(path)
    if not target.exists():
        return None
    try:
        document = json.loads(target.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise DraftwiseError(f"{where}: cannot read it ({error}); pass another file or remove it") from None
    except json.JSONDecodeError as error:
        raise DraftwiseError(f"{where}: not a learner state file (invalid JSON: {error.msg} at line {error.lineno}); "
                             "remove it to start afresh") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise DraftwiseError(f"{where}: not a learner state file (no \"format\": \"{FORMAT}\"); remove it or pass "
                             "another file")
    if document.get("version") != VERSION:
        raise DraftwiseError(f"{where}: state format version {document.get('version')!r}, this draftwise reads "
                             f"version {VERSION}; remove the file to start afresh")
    if not isinstance(document.get("state"), dict):
        raise DraftwiseError(f"{where}: the learner state is damaged (no \"state\" object); remove it to start afresh")
    return document


def apply_state(document: dict[str, Any], path: str | Path, policy: Any, policy_spec: str) -> None:
    """Put a read state into ``policy``: refused when it comes from another arm layout or policy."""
    where = f"--state {path}"
    arms, mine = document.get("arms"), list(policy.arms)
    if arms != mine:
        raise DraftwiseError(f"{where}: saved for arms {arms}, but this server's arms are {mine}; serve with the "
                             "same --policy/--arms/--drafter options, or remove the file")
    if document.get("policy") != policy_spec or document.get("class") != _class_name(policy):
        raise DraftwiseError(f"{where}: saved by policy {document.get('policy')!r} ({document.get('class')}), this "
                             f"server runs {policy_spec!r} ({_class_name(policy)}); pass --policy "
                             f"{document.get('policy')} or remove the file")
    try:
        _restore_object(policy, document["state"], policy)
    except (KeyError, TypeError, ValueError, AttributeError, ImportError) as error:
        raise DraftwiseError(f"{where}: the learner state is damaged ({type(error).__name__}: {error}); remove it "
                             "to start afresh") from None


# -- encoding ---------------------------------------------------------------------------------------------------
def _class_name(obj: Any) -> str:
    return f"{type(obj).__module__}:{type(obj).__qualname__}"


def _encode_object(obj: Any) -> dict[str, Any]:
    attrs = {}
    for name, value in vars(obj).items():
        if name in NOT_SAVED or (callable(value) and not isinstance(value, type)):
            continue
        try:
            attrs[name] = _encode(value)
        except TypeError as error:
            log.warning("learner state: %s.%s not saved (%s)", type(obj).__name__, name, error)
    return {"__object__": _class_name(obj), "attrs": attrs}


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype), "shape": list(value.shape)}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v) for v in value]}
    if isinstance(value, deque):
        return {"__deque__": [_encode(v) for v in value], "maxlen": value.maxlen}
    if isinstance(value, dict):
        return {"__dict__": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if type(value).__module__.startswith(SAFE_MODULES):
        return _encode_object(value)
    raise TypeError(f"cannot save a {type(value).__name__}")


def _decode(value: Any, existing: Any, root: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v, None, root) for v in value]
    if not isinstance(value, dict):
        return value
    if "__ndarray__" in value:
        return np.asarray(value["__ndarray__"], dtype=np.dtype(value["dtype"])).reshape(value["shape"])
    if "__tuple__" in value:
        return tuple(_decode(v, None, root) for v in value["__tuple__"])
    if "__deque__" in value:
        return deque((_decode(v, None, root) for v in value["__deque__"]), maxlen=value["maxlen"])
    if "__dict__" in value:
        return {_freeze(_decode(k, None, root)): _decode(v, None, root) for k, v in value["__dict__"]}
    if "__object__" in value:
        obj = existing if existing is not None and _class_name(existing) == value["__object__"] else \
            _new_object(value["__object__"])
        return _restore_object(obj, value, root)
    raise ValueError(f"unknown encoded value with keys {sorted(value)}")


def _restore_object(obj: Any, encoded: dict[str, Any], root: Any) -> Any:
    if encoded.get("__object__") != _class_name(obj):
        raise ValueError(f"expected {_class_name(obj)}, found {encoded.get('__object__')}")
    current = vars(obj)
    for name, value in encoded["attrs"].items():
        setattr(obj, name, _decode(value, current.get(name), root))
    if hasattr(obj, "reward") and hasattr(obj, "select"):  # a learner rebuilt here: its generator and reward
        from draftwise.feedback import signal

        obj.rng = getattr(obj, "rng", None) or root.rng
        obj._signal = signal(obj.reward)
    return obj


def _new_object(name: str) -> Any:
    module_name, _, qualname = name.partition(":")
    if not module_name.startswith(SAFE_MODULES) or "." in qualname:
        raise ValueError(f"refusing to rebuild {name!r}: only draftwise.policies classes are restored")
    cls = getattr(importlib.import_module(module_name), qualname)
    if not isinstance(cls, type):
        raise ValueError(f"{name!r} is not a class")
    return object.__new__(cls)


def _freeze(key: Any) -> Any:
    """A decoded dict key must be hashable: lists (inside keys) become tuples."""
    return tuple(_freeze(k) for k in key) if isinstance(key, (list, tuple)) else key
