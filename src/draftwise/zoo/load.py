"""Load zoo models by name: ``zoo:target``, ``zoo:code``, …, ``zoo:all`` (every zoo drafter).

A zoo model is a plain Hugging Face checkpoint folder (config.json, model.safetensors,
tokenizer files) shipped inside the package, so the engine loads it like any other model::

    >>> path = resolve_zoo_name("zoo:target")          # a local folder
    >>> AutoModelForCausalLM.from_pretrained(path)      # doctest: +SKIP

The folder ``zoo/models`` holds one sub-folder per model and a manifest ``zoo.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from draftwise.errors import DraftwiseError

PREFIX = "zoo:"
ALL = "zoo:all"
TARGET_NAME = "target"
TOY_TARGET = "zoo:target"
MANIFEST = "zoo.json"


def shipped_models_dir() -> Path:
    return Path(__file__).resolve().parent / "models"


@dataclass(frozen=True)
class ZooEntry:
    name: str  # without the "zoo:" prefix
    role: str  # "target", "drafter", or "head" (a white-box head on the target)
    domains: tuple[str, ...]
    params: int
    bytes: int  # model.safetensors size on disk
    path: str
    target: str = TOY_TARGET  # the target it drafts for: the toy zoo's, or a named real model
    target_vocab: int = 0  # that target's vocabulary size (recorded for named real models)


def read_manifest(models: Path | None = None) -> dict:
    folder = models or shipped_models_dir()
    path = folder / MANIFEST
    if not path.exists():
        raise DraftwiseError(
            f"no model zoo at {folder} (missing {MANIFEST}); build one with "
            "`draftwise zoo build --data ../shared/data --out DIR` and `draftwise zoo install --build DIR`"
        )
    return json.loads(path.read_text())


def zoo_entries(models: Path | None = None) -> list[ZooEntry]:
    """Every model in the zoo, the target first."""
    folder = models or shipped_models_dir()
    entries = [
        ZooEntry(
            name=m["name"],
            role=m["role"],
            domains=tuple(m["domains"]),
            params=int(m["params"]),
            bytes=(folder / m["name"] / "model.safetensors").stat().st_size
            if (folder / m["name"] / "model.safetensors").exists()
            else 0,
            path=str(folder / m["name"]),
            target=m.get("target", TOY_TARGET),
            target_vocab=int(m.get("target_vocab", 0)),
        )
        for m in read_manifest(folder)["models"]
    ]
    return sorted(entries, key=lambda e: (e.role != "target", e.name))


def is_zoo_name(name: str) -> bool:
    return name.startswith(PREFIX)


def zoo_names(models: Path | None = None) -> list[str]:
    """Every loadable zoo name, e.g. ``["zoo:target", "zoo:code", …, "zoo:generalist"]``."""
    return [PREFIX + e.name for e in zoo_entries(models)]


def zoo_drafter_names(models: Path | None = None, target: str = TOY_TARGET) -> list[str]:
    """Bare names (no ``zoo:`` prefix) of every zoo drafter for ``target`` (the toy zoo target by
    default, or a named real model such as ``smollm2``): what ``zoo:all`` stands for with it.

    ``["code", "generalist", "math", …]``; prefix them (``f"zoo:{name}"``) to resolve them.
    """
    return [e.name for e in zoo_entries(models) if e.role == "drafter" and e.target == target]


def zoo_families(models: Path | None = None) -> dict[str, int]:
    """Each target the zoo has drafters for → that target's vocabulary size."""
    folder = models or shipped_models_dir()
    families: dict[str, int] = {}
    for entry in zoo_entries(models):
        if entry.role == "drafter" and entry.target not in families:
            vocab = entry.target_vocab
            if not vocab and (folder / TARGET_NAME / "config.json").exists():
                vocab = int(json.loads((folder / TARGET_NAME / "config.json").read_text()).get("vocab_size", 0))
            families[entry.target] = vocab
    return families


def zoo_target_of(vocab_size: int, models: Path | None = None) -> str:
    """The target whose zoo drafters speak a vocabulary of ``vocab_size`` tokens (``zoo:all`` with it)."""
    families = zoo_families(models)
    for target, vocab in families.items():
        if vocab == vocab_size:
            return target
    known = ", ".join(f"{t} ({v} tokens)" for t, v in families.items())
    raise DraftwiseError(f"zoo:all: the zoo has no drafters for a target with a vocabulary of {vocab_size} tokens; "
                         f"it has drafters for {known}")


def zoo_generalist(vocab_size: int, models: Path | None = None) -> str | None:
    """``zoo:NAME`` of the zoo's generalist drafter (every domain) distilled for a named real model whose
    vocabulary has ``vocab_size`` tokens; None where the zoo has none (only a named real model's
    drafters record their target's vocabulary: the toy zoo target's are never among them)."""
    for entry in zoo_entries(models):
        if entry.role == "drafter" and entry.target_vocab == vocab_size and "general" in entry.domains:
            return PREFIX + entry.name
    return None


def zoo_head_names(models: Path | None = None, target: str | None = TOY_TARGET) -> list[str]:
    """Bare names of the zoo's white-box heads (role ``head``: EAGLE / Medusa heads) for ``target``
    (the toy zoo target by default, a named real model such as ``smollm2``, or None: every head).

    Not part of ``zoo:all``: a head only works on the target it was trained for, and it reads that
    target's hidden states, so it is asked for explicitly (``zoo:eagle-code``, or ``zoo:heads``).
    """
    return [e.name for e in zoo_entries(models) if e.role == "head" and target in (None, e.target)]


def expand_zoo_names(names: list[str], models: Path | None = None, target: str = TOY_TARGET) -> list[str]:
    """Replace ``zoo:all`` by every zoo drafter name for ``target``, keeping order and dropping duplicates."""
    expanded: list[str] = []
    for name in names:
        for item in [PREFIX + n for n in zoo_drafter_names(models, target)] if name == ALL else [name]:
            if item not in expanded:
                expanded.append(item)
    return expanded


def resolve_zoo_name(name: str, models: Path | None = None) -> str:
    """``zoo:NAME`` → the local folder of that HF checkpoint (config, safetensors, tokenizer)."""
    if not is_zoo_name(name):
        raise DraftwiseError(f"{name!r} is not a zoo name (zoo names start with {PREFIX!r})")
    if name == ALL:
        raise DraftwiseError(f"{ALL} names several drafters; expand it with expand_zoo_names()")
    bare = name[len(PREFIX) :]
    for entry in zoo_entries(models):
        if entry.name == bare:
            return entry.path
    raise DraftwiseError(f"unknown zoo model {name!r}; valid: {', '.join(zoo_names(models) + [ALL])}")


def zoo_domain_of(name: str, models: Path | None = None) -> tuple[str, ...]:
    """The domains a zoo model was trained (drafters: distilled) on."""
    bare = name[len(PREFIX) :] if is_zoo_name(name) else name
    for entry in zoo_entries(models):
        if entry.name == bare:
            return entry.domains
    raise DraftwiseError(f"unknown zoo model {name!r}")
