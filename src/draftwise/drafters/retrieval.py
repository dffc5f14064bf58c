"""REST-style retrieval drafter: continuations looked up in a suffix-array datastore.

The datastore is a stream of token ids — documents separated by :data:`SEPARATOR` (−1, never a
token) — with its suffix array (every position, sorted by the suffix starting there). To draft:

1. find the longest suffix of the context (≤ ``max_match`` tokens) that occurs in the stream: a
   binary search on the length, since an occurring suffix implies every shorter one occurs; each
   test narrows the suffix array's range token by token;
2. take the occurrences in that range — a deterministic, evenly spaced sample of at most
   ``sample`` of them — and the tokens that follow each one (up to its document's end);
3. the occurrences are sorted by what follows them, so equal continuations are neighbours:
   follow the most frequent next token while the path's estimated probability stays ≥
   ``min_prob`` (a chain, ``probs=None``), or count every continuation n-gram for a tree of
   candidates (:meth:`RetrievalDrafter.candidates`).

Folder format (``draftwise datastore build``): ``tokens.npy`` (int32 stream), ``sa.npy`` (int32
suffix array), ``meta.json``; both arrays are memory-mapped on load. See docs/retrieval.md.
"""

from __future__ import annotations

import gzip
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from draftwise.drafters.base import DRAFTERS, Draft, DraftContext, Drafter
from draftwise.errors import DraftwiseError

logger = logging.getLogger(__name__)

SEPARATOR = -1  # between documents (and after the last one): no continuation crosses it
FORMAT = "draftwise-retrieval"
VERSION = 1
FILES = ("tokens.npy", "sa.npy", "meta.json")
_END = np.iinfo(np.int64).min  # "past the end of the stream": below every token and the separator
_SCAN = 512  # ranges up to this size are narrowed with one vectorised searchsorted, larger by bisection


# ---------------------------------------------------------------------------------------------
# Pure functions: suffix array, matching, continuation counting
# ---------------------------------------------------------------------------------------------


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """Start positions of all suffixes of ``tokens`` in lexicographic order (prefix doubling).

    A suffix that ends is smaller than any extension of it. Each round sorts the suffixes by their
    first 2k tokens, given their ranks by the first k: the pair (rank[i], rank[i + k]) is one
    int64 key. Rounds stop once every rank is distinct: ⌈log2(longest repeat)⌉ + 1 sorts,
    O(n log n) each. int32 output (int64 beyond 2³¹ tokens).

    >>> suffix_array(np.array([2, 1, 2, 1])).tolist()  # 1 < 1 2 1 < 2 1 < 2 1 2 1
    [3, 1, 2, 0]
    >>> suffix_array(np.array([5, -1, 5, -1])).tolist()
    [3, 1, 2, 0]
    """
    tokens = np.asarray(tokens)
    n = len(tokens)
    dtype = np.int32 if n < 2**31 else np.int64
    if n == 0:
        return np.zeros(0, dtype=dtype)
    _, rank = np.unique(tokens, return_inverse=True)  # dense ranks by first token
    rank = rank.reshape(-1).astype(np.int64)
    order = np.argsort(rank, kind="stable")
    k = 1
    while rank.max() < n - 1 and k < n:
        second = np.full(n, -1, dtype=np.int64)  # −1: the suffix ends within k tokens
        second[: n - k] = rank[k:]
        key = rank * (n + 1) + (second + 1)  # < (n + 1)²: fits int64 for n < 3·10⁹
        del second
        order = np.argsort(key)
        ordered = key[order]
        del key
        rank[order] = np.concatenate(([0], np.cumsum(ordered[1:] != ordered[:-1])))  # new ranks, in place
        del ordered
        k *= 2
    return order.astype(dtype)


def _column(tokens: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """``tokens[starts]`` with positions past the end read as ``_END``."""
    inside = starts < len(tokens)
    out = np.full(len(starts), _END, dtype=np.int64)
    out[inside] = tokens[starts[inside]]
    return out


def _token_at(tokens: np.ndarray, position: int) -> int:
    return int(tokens[position]) if position < len(tokens) else int(_END)


def match_range(tokens: np.ndarray, sa: np.ndarray, pattern: Sequence[int]) -> tuple[int, int]:
    """The suffix-array range ``[lo, hi)`` of the suffixes that start with ``pattern`` (empty: lo == hi).

    Inside the range for ``pattern[:j]`` the suffixes are sorted by their token j, so each token
    narrows the range with two binary searches: O(len(pattern) · log n).

    >>> tokens = np.array([1, 2, 3, 1, 2, 4, -1], dtype=np.int32)
    >>> sa = suffix_array(tokens)
    >>> lo, hi = match_range(tokens, sa, [1, 2])
    >>> sorted(sa[lo:hi].tolist())  # "1 2" starts at 0 and at 3
    [0, 3]
    >>> match_range(tokens, sa, [2, 1])[1] - match_range(tokens, sa, [2, 1])[0]
    0
    """
    lo, hi = 0, len(sa)
    for j, token in enumerate(pattern):
        token = int(token)
        if hi - lo <= _SCAN:
            column = _column(tokens, sa[lo:hi].astype(np.int64) + j)  # sorted within the range
            lo, hi = lo + int(np.searchsorted(column, token, "left")), lo + int(np.searchsorted(column, token, "right"))
        else:
            lo, hi = _bisect(tokens, sa, lo, hi, j, token, left=True), _bisect(tokens, sa, lo, hi, j, token, left=False)
        if lo >= hi:
            return lo, lo
    return lo, hi


def _bisect(tokens: np.ndarray, sa: np.ndarray, lo: int, hi: int, j: int, token: int, *, left: bool) -> int:
    """First index in [lo, hi) whose suffix's token j is ≥ token (left) or > token (right)."""
    while lo < hi:
        mid = (lo + hi) // 2
        value = _token_at(tokens, int(sa[mid]) + j)
        if value < token or (not left and value == token):
            lo = mid + 1
        else:
            hi = mid
    return lo


class Match(NamedTuple):
    """The longest matched suffix of a context: its length and suffix-array range [lo, hi)."""

    length: int
    lo: int
    hi: int

    @property
    def occurrences(self) -> int:
        return self.hi - self.lo


def longest_match(tokens: np.ndarray, sa: np.ndarray, context: Sequence[int], max_match: int) -> Match:
    """The longest suffix of ``context`` (at most ``max_match`` tokens) that occurs in ``tokens``.

    If the last m tokens occur somewhere, so do the last m − 1 (one position later): the longest
    length is found by binary search, ⌈log2(max_match + 1)⌉ range searches. Length 0 means no
    match (its range is the whole array).

    >>> tokens = np.array([7, 1, 2, 3, -1, 9, 2, 3, -1], dtype=np.int32)
    >>> sa = suffix_array(tokens)
    >>> m = longest_match(tokens, sa, [5, 1, 2, 3], max_match=16)
    >>> m.length, sorted(sa[m.lo:m.hi].tolist())  # "1 2 3" occurs once, at 1
    (3, [1])
    >>> longest_match(tokens, sa, [5, 4], max_match=16).length
    0
    """
    best = Match(0, 0, len(sa))
    shortest, longest = 1, min(max_match, len(context))
    while shortest <= longest:
        length = (shortest + longest) // 2
        lo, hi = match_range(tokens, sa, context[len(context) - length :])
        if hi > lo:
            best, shortest = Match(length, lo, hi), length + 1
        else:
            longest = length - 1
    return best


def continuation_windows(
    tokens: np.ndarray, sa: np.ndarray, match: Match, length: int, sample: int
) -> np.ndarray:
    """The ``length`` tokens after each sampled occurrence of ``match``, as rows in suffix-array order.

    At most ``sample`` occurrences, evenly spaced over the range (deterministic; the range is sorted
    by continuation, so this is a stratified sample). Everything from a document's end on reads as
    :data:`SEPARATOR`. Rows stay lexicographically sorted, so equal prefixes are contiguous.

    >>> tokens = np.array([1, 2, 3, 1, 2, 4, -1, 1, 2, 3, -1], dtype=np.int32)
    >>> sa = suffix_array(tokens)
    >>> continuation_windows(tokens, sa, longest_match(tokens, sa, [1, 2], 4), 2, 8).tolist()
    [[3, -1], [3, 1], [4, -1]]
    """
    count = match.hi - match.lo
    if count <= 0 or length <= 0 or sample <= 0:
        return np.zeros((0, max(length, 0)), dtype=np.int64)
    picked = min(count, sample)
    rows_at = match.lo + (np.arange(picked, dtype=np.int64) * count) // picked
    starts = sa[rows_at].astype(np.int64) + match.length
    positions = starts[:, None] + np.arange(length, dtype=np.int64)  # (S, length)
    rows = _column(tokens, positions.reshape(-1)).reshape(positions.shape)
    ended = np.maximum.accumulate((rows == SEPARATOR) | (rows == _END), axis=1)
    rows[ended] = SEPARATOR
    return rows


def count_prefixes(rows: np.ndarray) -> dict[tuple[int, ...], int]:
    """How many rows start with each continuation n-gram (n = 1..width); separators end a row.

    ``rows`` must be sorted lexicographically (as :func:`continuation_windows` returns them):
    a group of equal prefixes is then a run of neighbouring rows.

    >>> count_prefixes(np.array([[3, -1], [3, 1], [4, -1]]))
    {(3,): 2, (4,): 1, (3, 1): 1}
    """
    counts: dict[tuple[int, ...], int] = {}
    total, width = rows.shape
    if total == 0:
        return counts
    as_lists = rows.tolist()
    changed = np.zeros(total, dtype=bool)
    changed[0] = True
    for depth in range(width):
        column = rows[:, depth]
        changed[1:] |= column[1:] != column[:-1]
        starts = np.flatnonzero(changed)
        sizes = np.diff(np.append(starts, total))
        keep = column[starts] != SEPARATOR
        if not keep.any():
            break
        for start, size in zip(starts[keep].tolist(), sizes[keep].tolist()):
            counts[tuple(as_lists[start][: depth + 1])] = size
    return counts


def count_continuations(
    tokens: np.ndarray, sa: np.ndarray, match: Match, length: int, sample: int
) -> dict[tuple[int, ...], int]:
    """Counts of the continuation n-grams (n ≤ ``length``) after ``match``, over ≤ ``sample`` occurrences.

    >>> tokens = np.array([1, 2, 3, 1, 2, 4, -1, 1, 2, 3, -1], dtype=np.int32)
    >>> sa = suffix_array(tokens)
    >>> count_continuations(tokens, sa, longest_match(tokens, sa, [1, 2], 4), 2, 8)
    {(3,): 2, (4,): 1, (3, 1): 1}
    """
    return count_prefixes(continuation_windows(tokens, sa, match, length, sample))


def greedy_chain(
    rows: np.ndarray, max_len: int, min_prob: float = 0.0, stop_ids: frozenset[int] = frozenset()
) -> list[int]:
    """Follow the most frequent next token (ties: the smallest id) while the path's frequency ≥ ``min_prob``.

    The path's frequency is the product of each step's share among the rows still following the
    chain (a row that ends counts against it). Stops after a token in ``stop_ids``.

    >>> greedy_chain(np.array([[3, -1], [3, 1], [3, 1], [4, 2]]), 4)
    [3, 1]
    >>> greedy_chain(np.array([[3, -1], [3, 1], [3, 1], [4, 2]]), 4, min_prob=0.6)
    [3]
    """
    chain: list[int] = []
    lo, hi = 0, len(rows)
    prob = 1.0
    for depth in range(min(max_len, rows.shape[1] if rows.ndim == 2 else 0)):
        column = rows[lo:hi, depth]  # sorted: the rows share the chain so far
        values, counts = np.unique(column[column != SEPARATOR], return_counts=True)
        if not len(values):
            break
        best = int(np.argmax(counts))
        prob *= int(counts[best]) / (hi - lo)
        if prob < min_prob:
            break
        token = int(values[best])
        chain.append(token)
        if token in stop_ids:
            break
        lo += int(np.searchsorted(column, token, "left"))
        hi = lo + int(counts[best])
    return chain


class Continuation(NamedTuple):
    tokens: tuple[int, ...]
    count: int  # sampled occurrences followed by these tokens


def _ranked(counts: dict[tuple[int, ...], int], nodes: int) -> list[tuple[tuple[int, ...], int]]:
    """The ``nodes`` most frequent prefixes, by (−count, length, tokens).

    A prefix is at least as frequent as its extensions and ranks first on ties (shorter), so the
    chosen prefixes are closed under taking prefixes — a tree — and each comes after its parent.
    """
    return sorted(counts.items(), key=lambda item: (-item[1], len(item[0]), item[0]))[: max(nodes, 0)]


def top_continuations(counts: dict[tuple[int, ...], int], nodes: int) -> list[Continuation]:
    """The root-to-leaf paths of the tree of the ``nodes`` most frequent continuation prefixes.

    >>> top_continuations({(3,): 3, (3, 1): 2, (3, 5): 1, (4,): 1, (3, 1, 2): 2}, nodes=4)
    [Continuation(tokens=(3, 1, 2), count=2), Continuation(tokens=(4,), count=1)]
    """
    ranked = _ranked(counts, nodes)
    parents = {prefix[:-1] for prefix, _ in ranked}
    return [Continuation(prefix, count) for prefix, count in ranked if prefix not in parents]


def continuation_tree(counts: dict[tuple[int, ...], int], nodes: int) -> tuple[list[int], list[int]]:
    """The ``nodes`` most frequent continuation prefixes as a draft tree: node tokens and parent
    indices (−1: the context), most frequent first, so parents precede children and siblings come
    in order of frequency.

    >>> continuation_tree({(3,): 3, (3, 1): 2, (3, 5): 1, (4,): 1, (3, 1, 2): 2}, nodes=4)
    ([3, 1, 2, 4], [-1, 0, 1, -1])
    """
    index: dict[tuple[int, ...], int] = {}
    tokens: list[int] = []
    parents: list[int] = []
    for prefix, _ in _ranked(counts, nodes):
        index[prefix] = len(tokens)
        tokens.append(prefix[-1])
        parents.append(index.get(prefix[:-1], -1))
    return tokens, parents


def concatenate_documents(documents: Iterable[Sequence[int]]) -> tuple[np.ndarray, int]:
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


# ---------------------------------------------------------------------------------------------
# The datastore folder
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Datastore:
    """A token stream and its suffix array (memory-mapped when loaded), plus ``meta.json``."""

    tokens: np.ndarray  # (N,) int32, SEPARATOR after every document
    sa: np.ndarray  # (N,) int32 suffix array of ``tokens``
    meta: dict[str, Any]
    path: Path | None = None

    @classmethod
    def from_documents(cls, documents: Iterable[Sequence[int]], meta: dict[str, Any] | None = None) -> Datastore:
        """Index tokenized documents in memory; ``meta`` adds fields (tokenizer, seed, build options)."""
        start = time.perf_counter()
        tokens, count = concatenate_documents(documents)
        if count == 0:
            raise DraftwiseError("no documents to index: the corpus is empty")
        sa = suffix_array(tokens)
        index_s = time.perf_counter() - start
        logger.info("indexed %d tokens from %d documents in %.2f s", len(tokens), count, index_s)
        info = {"format": FORMAT, "version": VERSION, "tokens": int(len(tokens)), "documents": count,
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


# ---------------------------------------------------------------------------------------------
# Corpus reading (text: one document per line; JSONL: text, or prompt/instruction + response)
# ---------------------------------------------------------------------------------------------

CORPUS_FORMATS = ("auto", "text", "jsonl")


def _open_text(path: Path) -> IO[str]:
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
        with _open_text(file) as handle:
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
                    raise DraftwiseError(f"{file}: line {number}: not valid JSON ({exc.msg}); "
                                         "a JSONL corpus holds one JSON object per line") from None
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


# ---------------------------------------------------------------------------------------------
# The drafter
# ---------------------------------------------------------------------------------------------


@DRAFTERS.register("rest")
class RetrievalDrafter(Drafter):
    """Most frequent continuation of the context's longest suffix found in a datastore (REST)."""

    def __init__(
        self,
        *,
        store: str | Datastore = "",
        max_match: int = 16,
        min_match: int = 1,
        sample: int = 128,
        min_prob: float = 0.1,
        tree: int = 0,
        name: str = "rest",
    ) -> None:
        if not store:
            raise DraftwiseError("rest: needs store=DIR, a datastore folder (build one with 'draftwise datastore build')")
        if max_match < 1 or not 1 <= min_match <= max_match or sample < 1 or not 0 <= min_prob <= 1 or tree < 0:
            raise DraftwiseError(
                "rest: need max_match ≥ 1, 1 ≤ min_match ≤ max_match, sample ≥ 1, 0 ≤ min_prob ≤ 1, tree ≥ 0 "
                f"(got max_match={max_match}, min_match={min_match}, sample={sample}, min_prob={min_prob}, tree={tree})"
            )
        self.name = name
        self.store = store
        self.max_match, self.min_match, self.sample, self.min_prob = max_match, min_match, sample, min_prob
        self.tree = tree  # > 0: draft a tree of this many nodes instead of a chain
        self.datastore = store if isinstance(store, Datastore) else Datastore.load(store)
        self.vocab_size: int | None = self.datastore.meta.get("vocab_size")

    def match(self, context: Sequence[int]) -> Match | None:
        """The longest matched suffix of ``context``, or None when shorter than ``min_match``."""
        found = self.datastore.longest_match(context, self.max_match)
        return found if found.length >= self.min_match else None

    def propose(self, context: Sequence[int], max_len: int, ctx: DraftContext, stop: Any = None) -> Draft:
        """The most frequent continuation as a chain; with ``tree`` > 0, a tree of the ``tree``
        most frequent continuation prefixes (no ``min_prob`` cut; depth ≤ ``max_len``)."""
        found = self.match(context) if max_len > 0 else None
        if found is None:
            return Draft([])
        rows = self.datastore.windows(found, max_len, self.sample)
        if not self.tree:
            return Draft(greedy_chain(rows, max_len, self.min_prob, ctx.eos_ids))
        tokens, parents = continuation_tree(_before_eos(count_prefixes(rows), ctx.eos_ids), self.tree)
        return Draft(tokens, parents=parents) if tokens else Draft([])

    def candidates(
        self, context: Sequence[int], max_len: int, nodes: int = 16, eos_ids: frozenset[int] = frozenset()
    ) -> list[Continuation]:
        """Several continuations with their counts: the root-to-leaf paths of the ``nodes`` most
        frequent continuation prefixes (the tree the ``tree`` option drafts). Paths stop after an EOS."""
        found = self.match(context) if max_len > 0 else None
        if found is None:
            return []
        counts = count_prefixes(self.datastore.windows(found, max_len, self.sample))
        return top_continuations(_before_eos(counts, eos_ids), nodes)

    def describe(self) -> dict[str, Any]:
        meta = self.datastore.meta
        where = self.datastore.path
        return {**super().describe(), "store": str(where) if where else "(in memory)", "max_match": self.max_match,
                "min_match": self.min_match, "sample": self.sample, "min_prob": self.min_prob, "tree": self.tree,
                "store_tokens": meta.get("tokens"), "store_documents": meta.get("documents"),
                "tokenizer": meta.get("tokenizer")}


def _before_eos(counts: dict[tuple[int, ...], int], eos_ids: frozenset[int]) -> dict[tuple[int, ...], int]:
    """Drop prefixes that go on past an EOS token (the rest stays closed under taking prefixes)."""
    if not eos_ids:
        return counts
    return {prefix: c for prefix, c in counts.items() if not eos_ids.intersection(prefix[:-1])}
