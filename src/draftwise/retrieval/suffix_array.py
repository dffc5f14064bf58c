"""Suffix-array matching over a token stream: the pure core of the REST retrieval drafter.

The stream holds documents separated by :data:`SEPARATOR` (−1, never a token); its suffix array
lists every position, sorted by the suffix starting there. Matching narrows the array's range token
by token; continuations are counted from the occurrences found (see
:mod:`draftwise.drafters.retrieval` for how a draft is made of them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

SEPARATOR = -1  # between documents (and after the last one): no continuation crosses it
_END = np.iinfo(np.int64).min  # "past the end of the stream": below every token and the separator
_SCAN = 512  # ranges up to this size are narrowed with one vectorised searchsorted, larger by bisection




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
    count: int  # type: ignore[assignment]  # sampled occurrences followed by these tokens (shadows tuple.count)


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
