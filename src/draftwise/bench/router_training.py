"""Where the router baseline (:mod:`draftwise.bench.router`) learns from, first that exists:

1. a labelled file (``--router-train``: prompt + drafter or domain per line), trained now;
2. the train split of an explicit zoo corpus (``--zoo-corpus`` / $DRAFTWISE_ZOO_CORPUS), trained now;
3. the router shipped with the zoo (``zoo/models/router.npz``, built by ``draftwise zoo router``);
4. the zoo corpus's train split regenerated from the shared datasets, trained now.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from draftwise.bench.datasets import (
    CORPUS_ENV,
    DATA_ENV,
    find_zoo_corpus,
    has_split,
    locate_zoo_corpus,
    regenerate_zoo_corpus,
    resolve_data_dir,
    zoo_training_texts,
)
from draftwise.bench.router import HYPERPARAMETERS, ROUTER_FILE, load_router, save_router, train_router
from draftwise.errors import DraftwiseError
from draftwise.zoo.load import shipped_models_dir

log = logging.getLogger(__name__)

ROUTER_PER_LABEL = 400  # zoo training prompts per domain for the router


class RouterSettings(Protocol):
    """The bench settings that choose the router's training data."""

    @property
    def router_train(self) -> str | None: ...  # a labelled JSONL file

    @property
    def zoo_corpus(self) -> str | None: ...  # a zoo build or corpus folder

    @property
    def seed(self) -> int: ...


def bench_router(config: RouterSettings) -> tuple[Any, dict[str, Any]]:
    """The static router of method ``router``, from the first source that exists:

    1. ``--router-train FILE`` (prompt + drafter or domain per line), trained now;
    2. the train split of an explicit zoo corpus (``--zoo-corpus`` / $DRAFTWISE_ZOO_CORPUS), trained now;
    3. the router shipped with the zoo (``zoo/models/router.npz``, built by ``draftwise zoo router``);
    4. the zoo corpus's train split regenerated from the shared datasets, trained now.
    """
    if config.router_train:
        texts, labels = labelled_prompts(config.router_train)
        router = train_router(texts, labels, seed=config.seed)
        return router, router_record(router, texts, labels, config.router_train, config.seed)
    explicit = config.zoo_corpus or os.environ.get(CORPUS_ENV)
    folder = locate_zoo_corpus(explicit, "train") if explicit else None
    if folder is None and (shipped := load_shipped_router()) is not None:
        return shipped
    folder = folder or locate_zoo_corpus(None, "train")
    if folder is None:
        raise DraftwiseError(
            "method router: no training prompts for the router (the zoo corpus's train split, train/DOMAIN.jsonl) "
            f"and no trained router shipped with the zoo ({shipped_router_path()}); pass --router-train FILE "
            "(JSONL: prompt + drafter or domain per line), point --zoo-corpus at a zoo build or corpus folder with "
            f"a train split, or set ${DATA_ENV} to the shared datasets folder to rebuild it")
    return train_zoo_router(folder, config.seed)


def train_zoo_router(folder: Path, seed: int) -> tuple[Any, dict[str, Any]]:
    """The router on up to ``ROUTER_PER_LABEL`` prompts per domain of a zoo corpus's train split."""
    texts, labels = zoo_training_texts(folder, ROUTER_PER_LABEL, seed)
    router = train_router(texts, labels, seed=seed)
    return router, router_record(router, texts, labels, str(folder / "train"), seed)


def router_record(router: Any, texts: Sequence[str], labels: Sequence[str], source: str, seed: int) -> dict[str, Any]:
    """How a router was trained (env.json, and the shipped router's file)."""
    info = {"source": source, "examples": len(texts), "labels": router.labels, "seed": seed,
            "train_accuracy": router.accuracy(texts, labels), "features": len(router.vocabulary),
            "per_label": ROUTER_PER_LABEL, "hyperparameters": HYPERPARAMETERS}
    log.info("router trained on %d prompts (%s): train accuracy %.3f", len(texts), source, info["train_accuracy"])
    return info


def shipped_router_path() -> Path:
    return shipped_models_dir() / ROUTER_FILE


def load_shipped_router() -> tuple[Any, dict[str, Any]] | None:
    """The router shipped with the zoo and its build record, or None when the zoo has none."""
    path = shipped_router_path()
    if not path.is_file():
        return None
    router, info = load_router(path)
    log.info("router: the zoo's shipped %s (%s)", path.name, info.get("built_with", "?"))
    return router, {**info, "file": str(path)}


def build_router_file(data: str | None, zoo_corpus: str | None, seed: int,
                      out: Path | None = None) -> tuple[Path, dict]:
    """``draftwise zoo router``: train the zoo's router, deterministically, and write it into the zoo.

    The training prompts are the zoo corpus's train split: an explicit ``zoo_corpus``, else the
    split regenerated from the shared datasets with the zoo build's budget and seed (the same split
    every time). Same data + same seed = the same file.
    """
    if zoo_corpus:
        folder = find_zoo_corpus(zoo_corpus, "train")
        origin = f"the train split of {folder}"
    else:
        rebuilt = regenerate_zoo_corpus(resolve_data_dir(data))
        if rebuilt is None or not has_split(rebuilt, "train"):
            raise DraftwiseError("zoo router: cannot rebuild the zoo corpus: the zoo's manifest (zoo.json) names no "
                                 "build budget; pass --zoo-corpus DIR (a zoo build or corpus folder)")
        folder = rebuilt
        origin = ("the zoo corpus's train split, rebuilt from the shared datasets (see data_checksums) with the zoo "
                  "build's budget and corpus seed (see corpus)")
    router, info = train_zoo_router(folder, seed)
    info.update(source=origin, corpus=folder.name, data_checksums=_data_checksums(data, zoo_corpus),
                built_with=f"draftwise zoo router --seed {seed}")
    path = out or shipped_router_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_router(router, path, info)
    return path, info


def _data_checksums(data: str | None, zoo_corpus: str | None) -> str | None:
    """sha256 of the datasets' SHA256SUMS file: names the exact data a router was trained from."""
    if zoo_corpus:
        return None
    sums = resolve_data_dir(data) / "SHA256SUMS"
    return hashlib.sha256(sums.read_bytes()).hexdigest() if sums.is_file() else None


def labelled_prompts(path: str) -> tuple[list[str], list[str]]:
    """Router training file: JSONL with ``prompt`` and ``drafter`` (or ``domain``) on each line."""
    p = Path(path)
    if not p.is_file():
        raise DraftwiseError(f"router training file {p} not found (JSONL: prompt + drafter or domain per line)")
    texts, labels = [], []
    for number, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            texts.append(str(obj["prompt"]))
            labels.append(str(obj.get("drafter") or obj["domain"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise DraftwiseError(f"{p}, line {number}: expected a JSON object with 'prompt' and 'drafter' or "
                                 "'domain'") from None
    if not texts:
        raise DraftwiseError(f"router training file {p} is empty")
    return texts, labels
