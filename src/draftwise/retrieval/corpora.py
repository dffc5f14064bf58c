"""Reading text corpora: plain text (one document per line) or JSONL, optionally gzipped.

Shared by the zoo's corpus builder and ``draftwise datastore build``; no drafter depends on it.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from draftwise.errors import DraftwiseError, json_error_text

CORPUS_FORMATS = ("auto", "text", "jsonl")


def open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def corpus_format(path: Path, fmt: str = "auto") -> str:
    """``text`` or ``jsonl``: by extension under ``auto`` (.jsonl, .json, optionally .gz → jsonl)."""
    if fmt not in CORPUS_FORMATS:
        raise DraftwiseError(f"unknown corpus format {fmt!r}; valid: {', '.join(CORPUS_FORMATS)}")
    if fmt != "auto":
        return fmt
    suffixes = [s for s in path.suffixes if s != ".gz"]
    return "jsonl" if suffixes and suffixes[-1] in {".jsonl", ".json"} else "text"


def document_of_record(record: Any) -> str:
    """The text of one JSONL record: ``text``, or ``prompt``/``instruction`` + newline + ``response``.

    >>> document_of_record({"instruction": "Add 1 and 2.", "response": "3"})
    'Add 1 and 2.\\n3'
    """
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    if "text" in record:
        parts = [record["text"]]
    elif "response" in record and ("prompt" in record or "instruction" in record):
        parts = [record.get("prompt", record.get("instruction")), record["response"]]
    else:
        raise ValueError("expected a 'text' field, or 'prompt' or 'instruction' with 'response'; "
                         f"got fields {', '.join(sorted(record)) or 'none'}")
    if not all(isinstance(part, str) for part in parts):
        raise ValueError("text fields must be strings")
    return "\n".join(parts)


def read_corpus(path: str | Path, fmt: str = "auto") -> Iterator[str]:
    """The documents of a corpus file, in order; blank lines are skipped. Errors name the line.

    A missing file or unknown format raises here; a bad line raises while iterating.
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise DraftwiseError(f"corpus file {str(path)!r} does not exist" if not file.exists()
                             else f"corpus {str(path)!r} is not a file")
    return _documents(file, corpus_format(file, fmt))


def _documents(file: Path, kind: str) -> Iterator[str]:
    number = 0
    try:
        with open_text(file) as handle:
            for number, line in enumerate(handle, 1):
                line = line.rstrip("\r\n")
                if not line.strip():
                    continue
                if kind == "text":
                    yield line
                    continue
                try:
                    yield document_of_record(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise DraftwiseError(f"{file}: line {number}: not valid JSON "
                                         f"({json_error_text(exc, line=False)}); a JSONL corpus holds one JSON "
                                         "object per line") from None
                except ValueError as exc:
                    raise DraftwiseError(f"{file}: line {number}: {exc}") from None
    except UnicodeDecodeError:
        raise DraftwiseError(f"{file}: line {number + 1}: not UTF-8 text") from None
    except (OSError, EOFError) as exc:  # gzip errors are OSError / EOFError
        raise DraftwiseError(f"{file}: unreadable ({exc})") from None


def encode_documents(
    texts: Sequence[str],
    encode: Callable[[list[str]], list[list[int]]],
    max_tokens: int | None = None,
    batch: int = 256,
    on_batch: Callable[[int], None] | None = None,
) -> list[np.ndarray]:
    """Tokenize ``texts`` in batches until ``max_tokens`` (the last document is cut to fit).

    Documents come back as int32 arrays (a tenth of a Python list's memory). ``on_batch(n)`` is
    told how many texts each batch consumed (for a progress bar).

    >>> docs = encode_documents(["a b", "c", "d e f"], lambda batch: [[len(w) for w in t.split()] for t in batch], 4)
    >>> [d.tolist() for d in docs]
    [[1, 1], [1], [1]]
    """
    documents: list[np.ndarray] = []
    total = 0
    for start in range(0, len(texts), batch):
        chunk = list(texts[start : start + batch])
        for ids in encode(chunk):
            if max_tokens is not None and total + len(ids) > max_tokens:
                ids = ids[: max_tokens - total]
            documents.append(np.asarray(ids, dtype=np.int32))
            total += len(ids)
            if max_tokens is not None and total >= max_tokens:
                if on_batch:
                    on_batch(len(chunk))
                return documents
        if on_batch:
            on_batch(len(chunk))
    return documents
