"""SuffixDecoding-style drafter: a depth-bounded suffix trie with continuation counts.

Every suffix (up to ``depth`` tokens) of the token stream is a path in the trie; a node's count is
how often that substring occurred. The trie grows incrementally: each new token extends the
``depth`` most recent suffixes by one node (no rebuild per token). To draft, find the longest
suffix of the context that occurred earlier with a continuation, then follow the most frequent
child while its estimated probability stays above ``min_prob``, for at most
``factor × match length`` tokens. A bounded global store of earlier responses gives matches
across queries.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from draftwise.drafters.base import DRAFTERS, Draft, DraftContext, Drafter
from draftwise.errors import DraftwiseError
from draftwise.tree import ROOT


class TrieNode:
    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.children: dict[int, TrieNode] = {}
        self.count = 0


class SuffixTrie:
    """Depth-bounded suffix trie over one token stream, extended one token at a time."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.root = TrieNode()
        self.active: list[TrieNode] = []  # nodes of the stream's current suffixes, shortest first

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            grown = [self.root, *self.active[: self.depth - 1]]
            self.active = [_child(node, token) for node in grown]

    def add_sequence(self, tokens: Sequence[int]) -> None:
        """Insert a separate sequence (its suffixes do not join the current stream)."""
        saved, self.active = self.active, []
        self.extend(tokens)
        self.active = saved

    def match(self, context: Sequence[int], max_match: int, upper: int | None = None) -> tuple[TrieNode | None, int]:
        """Deepest node for a suffix of ``context`` that has a continuation, and its length.

        A suffix with a continuation implies every shorter suffix has one, so the lengths that
        qualify are 1..best. With ``upper`` (a known bound on best, e.g. the previous match + the
        tokens added since) scan down from it: amortized two walks per token instead of one per length.
        """
        longest = min(max_match, len(context))
        if upper is not None:
            for length in range(min(upper, longest), 0, -1):
                node = self._walk(context[len(context) - length :])
                if node is not None and node.children:
                    return node, length
            return None, 0
        best: TrieNode | None = None
        best_len = 0
        for length in range(1, longest + 1):
            node = self._walk(context[len(context) - length :])
            if node is None or not node.children:
                break
            best, best_len = node, length
        return best, best_len

    def stream_match(self, max_match: int) -> tuple[TrieNode | None, int]:
        """``match`` for the stream this trie follows, with no walk: its suffixes' nodes are the
        active ones, and a node has children only if that suffix occurred earlier with a continuation."""
        best: TrieNode | None = None
        best_len = 0
        for length, node in enumerate(self.active[:max_match], start=1):
            if not node.children:
                break
            best, best_len = node, length
        return best, best_len

    def _walk(self, path: Sequence[int]) -> TrieNode | None:
        node = self.root
        for token in path:
            child = node.children.get(token)
            if child is None:
                return None
            node = child
        return node


def _child(node: TrieNode, token: int) -> TrieNode:
    child = node.children.get(token)
    if child is None:
        child = node.children[token] = TrieNode()
    child.count += 1
    return child


def greedy_continuation(node: TrieNode, max_len: int, min_prob: float) -> list[int]:
    """Follow the most frequent child while the path's estimated probability ≥ min_prob."""
    tokens: list[int] = []
    prob = 1.0
    while len(tokens) < max_len and node.children:
        token, child = max(node.children.items(), key=lambda item: item[1].count)
        total = sum(c.count for c in node.children.values())
        prob *= child.count / total
        if prob < min_prob:
            break
        tokens.append(token)
        node = child
    return tokens


def first_continuation(node: TrieNode, min_prob: float) -> int | None:
    """``greedy_continuation(node, 1, min_prob)``'s token, or None."""
    if not node.children:
        return None
    token, child = max(node.children.items(), key=lambda item: item[1].count)
    if child.count / sum(c.count for c in node.children.values()) < min_prob:  # as greedy_continuation
        return None
    return token


def branching_continuations(node: TrieNode, max_len: int, min_prob: float, branches: int,
                            eos_ids: frozenset[int]) -> tuple[list[int], list[int]]:
    """Up to ``branches`` continuations as a tree (point masses): each of the most frequent next
    tokens (estimated probability ≥ min_prob, the first always) followed greedily; parents −1 = root."""
    total = sum(c.count for c in node.children.values())
    ranked = sorted(node.children.items(), key=lambda item: -item[1].count)[:branches]
    tokens: list[int] = []
    parents: list[int] = []
    for rank, (token, child) in enumerate(ranked):
        prob = child.count / total
        if rank and prob < min_prob:
            break
        branch = [token] if token in eos_ids else [token] + greedy_continuation(child, max_len - 1, min_prob / prob)
        for i, tok in enumerate(branch):
            parents.append(ROOT if i == 0 else len(tokens) - 1)
            tokens.append(tok)
            if tok in eos_ids:
                break
    return tokens, parents


@DRAFTERS.register("suffix")
class SuffixDrafter(Drafter):
    """Suffix-trie drafter over prompt + generated tokens, plus a global store of earlier responses."""

    def __init__(
        self,
        *,
        depth: int = 24,
        factor: float = 1.0,
        min_prob: float = 0.1,
        store_tokens: int = 100_000,
        branches: int = 1,
        name: str = "suffix",
    ) -> None:
        if depth < 2 or factor <= 0 or not 0 <= min_prob <= 1 or store_tokens < 0 or branches < 1:
            raise DraftwiseError(
                "suffix: need depth ≥ 2, factor > 0, 0 ≤ min_prob ≤ 1, store_tokens ≥ 0, branches ≥ 1 "
                f"(got depth={depth}, factor={factor}, min_prob={min_prob}, store_tokens={store_tokens}, "
                f"branches={branches})"
            )
        self.name = name
        self.branches = branches  # > 1: a small tree, one greedy continuation per frequent next token
        self.depth, self.factor, self.min_prob, self.store_tokens = depth, factor, min_prob, store_tokens
        self.store: deque[list[int]] = deque()  # earlier responses, oldest first
        self.global_trie = SuffixTrie(depth)
        self.local = SuffixTrie(depth)
        self.seen = 0
        self.global_match = (0, 0)  # (context length, match length) of the last global-trie match

    def begin_query(self, prompt: Sequence[int]) -> None:
        self.local = SuffixTrie(self.depth)
        self.seen = 0
        self.global_match = (0, 0)

    def recover(self) -> None:
        self.begin_query(())  # the store of earlier responses stays

    def end_query(self, tokens: Sequence[int], prompt_len: int) -> None:
        response = list(tokens[prompt_len:])
        if not self.store_tokens or not response:
            return
        self.store.append(response[: self.store_tokens])
        stored = sum(map(len, self.store))
        if stored <= self.store_tokens:
            self.global_trie.add_sequence(self.store[-1])
            return
        while stored > self.store_tokens:  # evict the oldest responses, then rebuild once
            stored -= len(self.store.popleft())
        self.global_trie = SuffixTrie(self.depth)
        for response in self.store:
            self.global_trie.add_sequence(response)

    def _follow(self, context: Sequence[int]) -> None:
        """Bring this query's trie up to ``context`` (tokens only ever arrive at the end)."""
        if len(context) < self.seen:  # a context we have not followed: start over
            self.begin_query(context)
        self.local.extend(context[self.seen :])
        self.seen = len(context)

    def propose(self, context: Sequence[int], max_len: int, ctx: DraftContext, stop: Any = None) -> Draft:
        self._follow(context)
        if max_len <= 0:
            return Draft([])
        node, length = self._match(context)
        if node is None:
            return Draft([])
        limit = min(max_len, max(1, int(self.factor * length)))
        if self.branches > 1:
            tokens, parents = branching_continuations(node, limit, self.min_prob, self.branches, ctx.eos_ids)
            return Draft(tokens, None, parents) if parents.count(ROOT) > 1 else Draft(tokens)  # one branch: a chain
        tokens = greedy_continuation(node, limit, self.min_prob)
        for i, token in enumerate(tokens):
            if token in ctx.eos_ids:
                return Draft(tokens[: i + 1])
        return Draft(tokens)

    def _match(self, context: Sequence[int]) -> tuple[TrieNode | None, int]:
        """The deepest node with a continuation for a suffix of ``context`` (the local trie follows
        ``context``), in this query's trie or the earlier responses' one, and its length."""
        node, length = self.local.stream_match(self.depth - 1)
        if self.global_trie.root.children:  # earlier responses: their trie must be walked
            seen, previous = self.global_match
            upper = previous + len(context) - seen if seen <= len(context) else None
            other, other_length = self.global_trie.match(context, self.depth - 1, upper)
            self.global_match = (len(context), other_length)
            if other_length > length:
                node, length = other, other_length
        return node, length

    def first_tokens_along(self, context: Sequence[int], verified: Sequence[int],
                           ctx: DraftContext) -> list[int | None]:
        """``propose(…, 1)`` at each verified position, without building drafts: the most frequent
        child of the deepest matching node (local trie, else the earlier responses' trie)."""
        if self.branches > 1:
            return super().first_tokens_along(context, verified, ctx)
        sequence = list(context)
        out: list[int | None] = []
        for token in verified:
            self._follow(sequence)
            node, _ = self._match(sequence)
            out.append(None if node is None else first_continuation(node, self.min_prob))
            sequence.append(token)
        return out

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "depth": self.depth, "factor": self.factor,
                "min_prob": self.min_prob, "store_tokens": self.store_tokens, "branches": self.branches}
