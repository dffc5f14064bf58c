"""A retrieval datastore: a token stream with its suffix array, built from documents, saved as a folder.

Folder format (``draftwise datastore build``): ``tokens.npy`` (int32 stream), ``sa.npy`` (int32
suffix array), ``meta.json``; both arrays are memory-mapped on load. See docs/retrieval.md.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from draftwise.errors import DraftwiseError
from draftwise.retrieval.suffix_array import SEPARATOR, Match, continuation_windows, longest_match, suffix_array

logger = logging.getLogger(__name__)

FORMAT = "draftwise-retrieval"
VERSION = 1
FILES = ("tokens.npy", "sa.npy", "meta.json")

Document = Sequence[int] | np.ndarray  # one document's token ids


def concatenate_documents(documents: Iterable[Document]) -> tuple[np.ndarray, int]:
    """One int32 stream: each non-empty document followed by :data:`SEPARATOR`; and the document count.

    >>> stream, count = concatenate_documents([[4, 5], [], [6]])
    >>> stream.tolist(), count
    ([4, 5, -1, 6, -1], 2)
    """
    parts: list[np.ndarray] = []
    limit = np.iinfo(np.int32).max
    for number, document in enumerate(documents, 1):
        ids = np.asarray(document, dtype=np.int64).reshape(-1)
        if not len(ids):
            continue
        if ids.min() < 0 or ids.max() > limit:
            raise DraftwiseError(f"document {number}: token ids must lie in [0, {limit}]")
        parts.append(np.append(ids, SEPARATOR).astype(np.int32))
    if not parts:
        return np.zeros(0, dtype=np.int32), 0
    return np.concatenate(parts), len(parts)




@dataclass(frozen=True, eq=False)
class Datastore:
    """A token stream and its suffix array (memory-mapped when loaded), plus ``meta.json``."""

    tokens: np.ndarray  # (N,) int32, SEPARATOR after every document
    sa: np.ndarray  # (N,) int32 suffix array of ``tokens``
    meta: dict[str, Any]
    path: Path | None = None

    @classmethod
    def from_documents(cls, documents: Iterable[Document], meta: dict[str, Any] | None = None) -> Datastore:
        """Index tokenized documents in memory; ``meta`` adds fields (tokenizer, seed, build options)."""
        start = time.perf_counter()
        tokens, count = concatenate_documents(documents)
        if count == 0:
            raise DraftwiseError("no documents to index: the corpus is empty")
        sa = suffix_array(tokens)
        index_s = time.perf_counter() - start
        logger.info("indexed %d tokens from %d documents in %.2f s", len(tokens), count, index_s)
        info = {"format": FORMAT, "version": VERSION, "tokens": len(tokens), "documents": count,
                "separator": SEPARATOR, "max_token_id": int(tokens.max()), "index_s": round(index_s, 3),
                **(meta or {})}
        return cls(tokens, sa, info)

    @classmethod
    def load(cls, path: str | Path) -> Datastore:
        """Open a datastore folder; the arrays are memory-mapped, not read."""
        folder = Path(path).expanduser()
        if not folder.is_dir():
            raise DraftwiseError(f"datastore {str(path)!r} does not exist (build one with 'draftwise datastore build')")
        missing = [name for name in FILES if not (folder / name).is_file()]
        if missing:
            raise DraftwiseError(f"{str(path)!r} is not a datastore: {', '.join(missing)} missing")
        try:
            meta = json.loads((folder / "meta.json").read_text())
            tokens = np.asarray(np.load(folder / "tokens.npy", mmap_mode="r"))  # a plain view of the mapping
            sa = np.asarray(np.load(folder / "sa.npy", mmap_mode="r"))
        except (OSError, ValueError) as exc:
            raise DraftwiseError(f"datastore {str(path)!r} is unreadable: {exc}") from None
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise DraftwiseError(f"datastore {str(path)!r}: meta.json is not {FORMAT} version {VERSION}")
        if tokens.ndim != 1 or sa.shape != tokens.shape:
            raise DraftwiseError(f"datastore {str(path)!r}: tokens.npy and sa.npy differ in shape")
        return cls(tokens, sa, meta, folder)

    def save(self, path: str | Path) -> Path:
        folder = Path(path).expanduser()
        if folder.exists() and any(folder.iterdir()) and not (folder / "meta.json").is_file():
            raise DraftwiseError(f"{str(path)!r} exists and is not a datastore; choose an empty or new folder")
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "tokens.npy", self.tokens.astype(np.int32, copy=False))
        np.save(folder / "sa.npy", self.sa)
        (folder / "meta.json").write_text(json.dumps(self.meta, indent=2) + "\n")
        return folder

    @property
    def nbytes(self) -> int:
        return int(self.tokens.nbytes + self.sa.nbytes)

    def longest_match(self, context: Sequence[int], max_match: int) -> Match:
        return longest_match(self.tokens, self.sa, context, max_match)

    def windows(self, match: Match, length: int, sample: int) -> np.ndarray:
        return continuation_windows(self.tokens, self.sa, match, length, sample)
