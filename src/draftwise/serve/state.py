"""The learner's state in a file (``draftwise serve --state FILE``): loaded at start, saved on shutdown.

JSON, never pickle: loading a file runs no code and builds no object from a name in it. It holds a format
name and version, the policy spec and class, the arm names, and the learner's *learned* attributes
(:attr:`~draftwise.policies.Policy.learned`: its evidence, nested learners included) encoded by type:
numpy arrays with their dtype and shape, tuples, deques, sets, dicts with any keys (ctx-ucb keys its
contexts by tuples). Configuration comes from the policy spec, per-query state starts afresh, and the
random generator and reward function are the server's own.

Loading goes through a schema: a learner built from the same spec and arms. Every saved attribute must be
one it learns, and each value must have the type and shape of that learner's own value (numbers,
arrays of the same shape, tuples of the same length, containers whose items fit, nested learners of the
same class); the learner then checks that the values hold together (:meth:`~draftwise.policies.Policy.
check_state`). Other data attributes of the learner (its configuration, from older files) are ignored;
anything else — a method, an unknown name, a value of the wrong shape — refuses the file with one line
naming it. :func:`read_state` does all of that before the models load; :func:`apply_state` checks the
arms against the server's and puts the state in.
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import os
import tempfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from draftwise.errors import DraftwiseError, json_error_text
from draftwise.policies import make_policy
from draftwise.policies.base import learned_attributes

FORMAT = "draftwise-learner-state"
VERSION = 1
SAFE_MODULES = "draftwise.policies."  # learners and their helpers: the only objects a state holds


@dataclass(frozen=True)
class SavedState:
    """A state file read and checked against a learner of its own spec and arms."""

    path: str
    policy: str
    cls: str
    arms: tuple[str, ...]
    state: dict[str, Any]  # the encoded learner, as in the file


def save_state(path: str | Path, policy: Any, policy_spec: str) -> None:
    """Write ``policy``'s learned state to ``path`` atomically (a temporary file, then a rename)."""
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
    saved = read_state(path, policy_spec)
    if saved is None:
        return False
    apply_state(saved, policy)
    return True


def read_state(path: str | Path, policy_spec: str) -> SavedState | None:
    """The state file, checked through the schema of a learner built from ``policy_spec`` and the saved
    arms (no model needed); None when there is no file yet. Anything wrong is a :class:`DraftwiseError`
    of one line that names it."""
    where = f"--state {path}"
    target = Path(path)
    if not target.exists():
        return None
    try:
        document = json.loads(target.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise DraftwiseError(f"{where}: cannot read it ({error}); pass another file or remove it") from None
    except json.JSONDecodeError as error:
        raise DraftwiseError(f"{where}: not a learner state file (invalid JSON: {json_error_text(error)}); pass a "
                             "file that draftwise serve --state saved, or remove it to start afresh") from None
    except RecursionError:
        raise DraftwiseError(f"{where}: not a learner state file (nested too deeply); remove it") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise DraftwiseError(f"{where}: not a learner state file (no \"format\": \"{FORMAT}\"); remove it or pass "
                             "another file")
    if document.get("version") != VERSION:
        raise DraftwiseError(f"{where}: state format version {document.get('version')!r}, this draftwise reads "
                             f"version {VERSION}; remove the file to start afresh")
    state, arms = document.get("state"), document.get("arms")
    if not isinstance(state, dict):
        raise DraftwiseError(f"{where}: the learner state is damaged (no \"state\" object); remove it to start afresh")
    if not (isinstance(arms, list) and arms and all(isinstance(a, str) for a in arms)):
        raise DraftwiseError(f"{where}: the learner state is damaged (\"arms\" must be a list of arm names); remove "
                             "it to start afresh")
    if document.get("policy") != policy_spec:
        raise DraftwiseError(f"{where}: saved by policy {document.get('policy')!r} ({document.get('class')}), this "
                             f"server runs {policy_spec!r}; pass --policy {document.get('policy')} or remove the file")
    try:
        template = make_policy(policy_spec, arms, np.random.default_rng(0))
    except DraftwiseError as error:
        raise DraftwiseError(f"{where}: the saved arms {arms} do not fit policy {policy_spec!r} ({error}); remove "
                             "the file") from None
    saved = SavedState(str(path), policy_spec, str(document.get("class")), tuple(arms), state)
    _check_class(saved, template)
    _restored(template, saved)
    return saved


def apply_state(saved: SavedState, policy: Any) -> None:
    """Put a checked state into ``policy`` (the server's learner), all or nothing: refused when the
    server's arms or learner differ from the saved ones, or when a value does not fit this learner."""
    mine = list(policy.arms)
    if list(saved.arms) != mine:
        raise DraftwiseError(f"--state {saved.path}: saved for arms {list(saved.arms)}, but this server's arms are "
                             f"{mine}; serve with the same --policy/--arms/--drafter options, or remove the file")
    _check_class(saved, policy)
    policy.take_learned(_restored(policy, saved))


def _check_class(saved: SavedState, policy: Any) -> None:
    if saved.cls != _class_name(policy):
        raise DraftwiseError(f"--state {saved.path}: saved by {saved.cls}, this server's policy {saved.policy!r} is "
                             f"{_class_name(policy)}; remove the file to start afresh")


def _restored(like: Any, saved: SavedState) -> Any:
    try:
        return _object(saved.state, like, type(like).__name__)
    except Damaged as error:
        raise DraftwiseError(f"--state {saved.path}: the learner state is damaged ({error}); remove it to start "
                             "afresh") from None


# -- encoding ---------------------------------------------------------------------------------------------------
def _class_name(obj: Any) -> str:
    return f"{type(obj).__module__}:{type(obj).__qualname__}"


def _saved_attributes(obj: Any) -> tuple[str, ...]:
    """What an object's saved state holds: its learned attributes (every data attribute of a helper
    that declares none)."""
    return learned_attributes(obj) or tuple(name for name, value in vars(obj).items() if not callable(value))


def _encode_object(obj: Any) -> dict[str, Any]:
    return {"__object__": _class_name(obj), "attrs": {name: _encode(getattr(obj, name))
                                                      for name in _saved_attributes(obj)}}


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, str, int, float)):
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
    if isinstance(value, (set, frozenset)):
        kind = "__frozenset__" if isinstance(value, frozenset) else "__set__"
        return {kind: [_encode(v) for v in sorted(value, key=repr)]}
    if isinstance(value, dict):
        return {"__dict__": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if type(value).__module__.startswith(SAFE_MODULES):
        return _encode_object(value)
    raise TypeError(f"a learner's state cannot hold a {type(value).__name__}")


# -- decoding through the schema ---------------------------------------------------------------------------------
class Damaged(ValueError):
    """A saved value that does not fit the schema; the message names where and what."""


def _object(encoded: Any, like: Any, where: str) -> Any:
    """A shallow copy of ``like`` holding the saved learned values (each checked against ``like``'s own)."""
    if not isinstance(encoded, dict) or not isinstance(encoded.get("attrs"), dict) or "__object__" not in encoded:
        raise Damaged(f"{where} must be a saved {type(like).__name__}, found {_describe_saved(encoded)}")
    if encoded["__object__"] != _class_name(like):
        raise Damaged(f"{where} is a {encoded['__object__']!r}, expected {_class_name(like)}")
    attrs: dict[str, Any] = encoded["attrs"]
    learned = _saved_attributes(like)
    for name in attrs:
        if name not in learned and not _is_data(like, name):
            what = "a method" if _is_method(like, name) else "not an attribute"
            raise Damaged(f"{where}.{name} is {what} of {type(like).__name__}; its saved state is "
                          f"{', '.join(learned) or 'empty'}")
    missing = [name for name in learned if name not in attrs]
    if missing:
        raise Damaged(f"{where} lacks {', '.join(missing)}")
    examples = like.state_examples() if hasattr(like, "state_examples") else {}
    restored = copy.copy(like)
    for name in learned:
        current = getattr(like, name)
        setattr(restored, name, _one_of(attrs[name], [*examples.get(name, []), current], f"{where}.{name}"))
    if hasattr(restored, "check_state"):
        try:
            restored.check_state()
        except (ValueError, TypeError, IndexError) as error:
            raise Damaged(str(error)) from None
    return restored


def _is_data(obj: Any, name: str) -> bool:
    """Whether ``name`` is a data attribute of ``obj`` (its own, or its class's: configuration, caches)."""
    if name in vars(obj):
        return not callable(vars(obj)[name])
    static = inspect.getattr_static(obj, name, _MISSING)
    return static is not _MISSING and not _is_method(obj, name)


def _is_method(obj: Any, name: str) -> bool:
    static = inspect.getattr_static(obj, name, None)
    return callable(static) or isinstance(static, (property, staticmethod, classmethod))


_MISSING = object()


def _one_of(value: Any, likes: list[Any], where: str) -> Any:
    """``value`` decoded as the first of ``likes`` it fits."""
    errors = []
    for like in likes:
        try:
            return _value(value, like, where)
        except Damaged as error:
            errors.append(error)
    shapes = list(dict.fromkeys(_describe(like) for like in likes))
    if len(shapes) == 1:
        raise errors[0]
    raise Damaged(f"{where} is {_describe_saved(value)}, expected {' or '.join(shapes)}")


def _value(value: Any, like: Any, where: str) -> Any:
    """``value`` (as saved) decoded into the type and shape of ``like``, or :class:`Damaged`."""
    def wrong() -> Damaged:
        return Damaged(f"{where} is {_describe_saved(value)}, expected {_describe(like)}")

    if like is None:
        if value is not None:
            raise wrong()
        return None
    if isinstance(like, (bool, np.bool_)):
        if not isinstance(value, bool):
            raise wrong()
        return value
    if isinstance(like, (int, np.integer)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong()
        return value
    if isinstance(like, (float, np.floating)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise wrong()
        return float(value)
    if isinstance(like, str):
        if not isinstance(value, str):
            raise wrong()
        return value
    if isinstance(like, np.ndarray):
        return _array(value, like, where, wrong)
    if isinstance(like, tuple):
        items = _tagged(value, "__tuple__", wrong)
        if len(items) != len(like):
            raise Damaged(f"{where} is a tuple of {len(items)}, expected {_describe(like)}")
        return tuple(_value(v, lk, f"{where}[{i}]") for i, (v, lk) in enumerate(zip(items, like)))
    if isinstance(like, deque):
        items = _tagged(value, "__deque__", wrong)
        if value.get("maxlen") != like.maxlen:
            raise Damaged(f"{where} holds at most {value.get('maxlen')!r} items, expected {like.maxlen!r}")
        return deque(_items(items, list(like), where), maxlen=like.maxlen)
    if isinstance(like, (set, frozenset)):
        kind = "__frozenset__" if isinstance(like, frozenset) else "__set__"
        return type(like)(_items(_tagged(value, kind, wrong), list(like), where))
    if isinstance(like, list):
        if not isinstance(value, list):
            raise wrong()
        if like and all(type(lk).__module__.startswith(SAFE_MODULES) for lk in like):  # nested learners, by place
            if len(value) != len(like):
                raise Damaged(f"{where} holds {len(value)} learners, expected {len(like)}")
            return [_value(v, lk, f"{where}[{i}]") for i, (v, lk) in enumerate(zip(value, like))]
        return _items(value, like, where)
    if isinstance(like, dict):
        pairs = _tagged(value, "__dict__", wrong)
        if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
            raise wrong()
        keys = _items([k for k, _ in pairs], list(like), f"{where} key")
        return {key: _one_of(saved, [like[k] for k in _fitting_keys(key, like)], f"{where}[{key!r}]")
                for key, (_, saved) in zip(keys, pairs)}
    if type(like).__module__.startswith(SAFE_MODULES):
        return _object(value, like, where)
    raise Damaged(f"{where}: a {type(like).__name__} is not restored")


def _array(value: Any, like: np.ndarray, where: str, wrong: Any) -> np.ndarray:
    if not isinstance(value, dict) or "__ndarray__" not in value:
        raise wrong()
    try:
        array = np.asarray(value["__ndarray__"], dtype=like.dtype)
    except (TypeError, ValueError, OverflowError):
        raise Damaged(f"{where} must hold {like.dtype} numbers") from None
    if array.shape != like.shape:
        raise Damaged(f"{where} has shape {list(array.shape)}, expected {list(like.shape)}")
    if array.dtype.kind == "f" and np.isnan(array).any():
        raise Damaged(f"{where} holds NaN")
    return array


def _tagged(value: Any, tag: str, wrong: Any) -> list[Any]:
    if not isinstance(value, dict) or not isinstance(value.get(tag), list):
        raise wrong()
    items: list[Any] = value[tag]
    return items


def _items(values: list[Any], likes: list[Any], where: str) -> list[Any]:
    """Container items, each decoded as one of the template's items (distinct shapes only)."""
    if values and not likes:
        raise Damaged(f"{where} must be empty")
    distinct = list({_signature(lk): lk for lk in likes}.values())
    return [_one_of(v, distinct, f"{where}[{i}]") for i, v in enumerate(values)]


def _fitting_keys(key: Any, like: dict[Any, Any]) -> list[Any]:
    fitting = [k for k in like if _signature(k) == _signature(key)]
    return fitting or list(like)


def _signature(value: Any) -> Any:
    """The type and shape of a value (items of the same signature are interchangeable templates)."""
    if isinstance(value, np.ndarray):
        return ("array", value.shape, value.dtype.kind)
    if isinstance(value, tuple):
        return ("tuple", *(_signature(v) for v in value))
    return type(value).__name__


def _describe(like: Any) -> str:
    if like is None:
        return "null"
    if isinstance(like, (bool, np.bool_)):
        return "true or false"
    if isinstance(like, (int, np.integer)):
        return "an integer"
    if isinstance(like, (float, np.floating)):
        return "a number"
    if isinstance(like, str):
        return "a string"
    if isinstance(like, np.ndarray):
        return f"an array of shape {list(like.shape)}"
    if isinstance(like, tuple):
        return f"a tuple of {len(like)}"
    if isinstance(like, (list, deque, set, frozenset, dict)):
        return f"a {type(like).__name__}"
    return f"a saved {type(like).__name__}"


def _describe_saved(value: Any) -> str:
    if isinstance(value, dict):
        tags = [k for k in ("__ndarray__", "__tuple__", "__deque__", "__set__", "__frozenset__", "__dict__",
                            "__object__") if k in value]
        return f"an encoded {tags[0].strip('_')}" if tags else "an object"
    text = json.dumps(value)
    if len(text) <= 40:
        return text
    return f"a list of {len(value)}" if isinstance(value, list) else text[:37] + "..."
