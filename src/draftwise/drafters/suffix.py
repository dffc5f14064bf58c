"""SuffixDecoding-style drafter: a depth-bounded suffix trie with continuation counts.

Every suffix (up to ``depth`` tokens) of the token stream is a path in the trie; a node's count is
how often that substring occurred. The trie grows incrementally: each new token extends the
``depth`` most recent suffixes by one node (no rebuild per token). A bounded global store of
earlier responses gives matches across queries.

To draft (SuffixDecoding's scoring, Oliaro et al. 2024): every suffix of the context that occurs in
a trie is a candidate match; from each, follow the most frequent child while the path's estimated
probability (the product of ``child.count / node.count``) stays ≥ ``min_prob``, for at most
``factor × match length`` tokens; keep the candidate whose draft scores highest, the score being
the sum of its tokens' path probabilities (the expected number accepted). The deepest match is not
always best: in a depth-bounded trie a long match leaves few tokens below it, and a match seen once
says less than a shorter one seen often.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from draftwise.drafters.base import DRAFTERS, Draft, DraftContext, Drafter
from draftwise.errors import DraftwiseError
from draftwise.tree import ROOT

Node = int  # a trie node: its index in the trie's per-node lists (0: the root)
ROOT_NODE: Node = 0
NO_CHILD = -1
_SHIFT = 32  # an edge's key: parent << 32 | token (token ids are below 2**32)


class SuffixTrie:
    """Depth-bounded suffix trie over one token stream, extended one token at a time.

    Nodes are integers: edges live in one dict keyed by ``parent << 32 | token``, and each node's
    count, token and most frequent child in flat lists. A trie of objects (a node with a dict of
    children) holds two garbage-collected containers per node, ≈ 24 new ones per token, and the
    collector's passes over them took ¾ of the drafter's time (``benchmarks/suffix_cost.py``);
    ints and a dict of ints are never traversed.
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.edges: dict[int, Node] = {}
        self.count: list[int] = [0]
        self.token: list[int] = [-1]
        # The child to follow: the most frequent, the first created among equals (ids grow with
        # creation, so "first" is the smallest id) — what max() over the children in insertion
        # order gives. Counts only grow, so it is kept up to date as they do.
        self.best: list[Node] = [NO_CHILD]
        self.first: list[Node] = [NO_CHILD]  # children as a linked list, newest first
        self.sibling: list[Node] = [NO_CHILD]
        self.active: list[Node] = []  # nodes of the stream's current suffixes, shortest first

    def extend(self, tokens: Sequence[int]) -> None:
        self.active = self.grow(self.active, tokens)

    def grow(self, stream: list[Node], tokens: Sequence[int]) -> list[Node]:
        """Insert ``tokens`` at the end of a stream whose current suffixes' nodes are ``stream``
        (shortest first); the stream's nodes after them. The hot loop of every lookup-led round,
        written out."""
        edges, count, best, keep = self.edges, self.count, self.best, self.depth - 1
        for token in tokens:
            grown = []
            for node in (ROOT_NODE, *stream[:keep]):
                key = node << _SHIFT | token
                child = edges.get(key)
                if child is None:
                    child = edges[key] = len(count)
                    count.append(0)
                    self.token.append(token)
                    best.append(NO_CHILD)
                    self.first.append(NO_CHILD)
                    self.sibling.append(self.first[node])
                    self.first[node] = child
                n = count[child] = count[child] + 1
                lead = best[node]
                if lead != child and (lead == NO_CHILD or n > count[lead] or (n == count[lead] and child < lead)):
                    best[node] = child
                grown.append(child)
            stream = grown
        return stream

    def add_sequence(self, tokens: Sequence[int]) -> None:
        """Insert a separate sequence (its suffixes do not join the current stream)."""
        self.grow([], tokens)

    def child(self, node: Node, token: int) -> Node | None:
        return self.edges.get(node << _SHIFT | token)

    def children(self, node: Node) -> list[tuple[int, Node]]:
        """``(token, child)`` pairs, in the order they were created."""
        out = []
        child = self.first[node]
        while child != NO_CHILD:
            out.append((self.token[child], child))
            child = self.sibling[child]
        return out[::-1]

    def is_empty(self) -> bool:
        return self.best[ROOT_NODE] == NO_CHILD

    def suffix_nodes(self, context: Sequence[int]) -> list[Node]:
        """The nodes of ``context``'s suffixes that occur here, shortest first (walked from the root).

        Every substring of a stored sequence is a path, so if the suffix of length m is missing so
        is every longer one: the list holds the lengths 1..m−1 exactly.
        """
        nodes: list[Node] = []
        for length in range(1, min(self.depth, len(context)) + 1):
            node = self._walk(context[len(context) - length :])
            if node is None:
                break
            nodes.append(node)
        return nodes

    def advance(self, nodes: list[Node], token: int) -> list[Node]:
        """The shortest suffix nodes of ``context + [token]`` from ``nodes``, those of ``context``:
        exact where ``nodes`` was, possibly short where the trie has grown since (:meth:`lengthen`)."""
        edges = self.edges
        first = edges.get(token)  # the root's child
        if first is None:
            return []
        out = [first]
        for node in nodes[: self.depth - 1]:
            child = edges.get(node << _SHIFT | token)
            if child is None:
                break  # that suffix is missing now, so is every longer one
            out.append(child)
        return out

    def lengthen(self, nodes: list[Node], context: Sequence[int]) -> list[Node]:
        """``suffix_nodes(context)`` from its shortest ``nodes``: the longer ones a sequence added
        since may have created, walked from the root."""
        while len(nodes) < min(self.depth, len(context)):
            longer = self._walk(context[len(context) - len(nodes) - 1 :])
            if longer is None:
                break
            nodes = [*nodes, longer]
        return nodes

    def _walk(self, path: Sequence[int]) -> Node | None:
        node: Node | None = ROOT_NODE
        for token in path:
            node = self.edges.get(node << _SHIFT | token)  # type: ignore[operator]
            if node is None:
                return None
        return node

    def scored_path(self, node: Node, max_len: int, min_prob: float) -> tuple[list[int], float]:
        """Follow the most frequent child while the path's probability (Π child.count / node.count)
        stays ≥ ``min_prob``: the tokens and their summed probabilities (the draft's score).

        >>> trie = SuffixTrie(4)
        >>> trie.add_sequence([1, 2, 3, 1, 2, 4, 1])  # "1 2" twice: then 3 once, 4 once
        >>> trie.scored_path(trie.suffix_nodes([1, 2])[-1], 3, 0.1)
        ([3, 1], 1.0)
        """
        count, best = self.count, self.best
        tokens: list[int] = []
        prob, score = 1.0, 0.0
        child = best[node]
        while len(tokens) < max_len and child != NO_CHILD:
            prob *= count[child] / count[node]
            if prob < min_prob:
                break
            tokens.append(self.token[child])
            score += prob
            node, child = child, best[child]
        return tokens, score


@dataclass
class Candidate:
    """The best-scoring draft so far: its trie and match's node, draft budget, tokens and score."""

    trie: SuffixTrie | None = None
    node: Node = ROOT_NODE
    limit: int = 0
    tokens: list[int] = field(default_factory=list)
    score: float = 0.0


def best_candidate(trie: SuffixTrie, nodes: Sequence[Node], max_len: int, factor: float, min_prob: float,
                   best: Candidate | None = None) -> Candidate:
    """Score a draft from every match in ``nodes`` (``nodes[m-1]``: the context's last m tokens),
    longest first, and keep the best (ties: the one already held, else the longer match). A match
    of length m drafts at most ``factor × m`` tokens and, in a depth-bounded trie, ``depth − m``;
    a score never exceeds its budget, so budgets below the best score are skipped unwalked."""
    best = best if best is not None else Candidate()
    for length in range(len(nodes), 0, -1):
        cap = min(max_len, int(factor * length + 1e-9))
        if cap <= best.score:
            break  # shorter matches have smaller caps still
        node = nodes[length - 1]
        limit = min(cap, trie.depth - length)
        if limit <= best.score or trie.best[node] == NO_CHILD:
            continue
        tokens, score = trie.scored_path(node, limit, min_prob)
        if score > best.score:
            best = Candidate(trie, node, limit, tokens, score)
    return best


def branching_continuations(trie: SuffixTrie, node: Node, max_len: int, min_prob: float, branches: int,
                            eos_ids: frozenset[int]) -> tuple[list[int], list[int]]:
    """Up to ``branches`` continuations as a tree (point masses): each of the most frequent next
    tokens (estimated probability ≥ min_prob, the first always) followed as
    :meth:`SuffixTrie.scored_path` does; parents −1 = root."""
    ranked = sorted(trie.children(node), key=lambda item: -trie.count[item[1]])[:branches]
    tokens: list[int] = []
    parents: list[int] = []
    for rank, (token, child) in enumerate(ranked):
        prob = trie.count[child] / trie.count[node]
        if rank and prob < min_prob:
            break
        branch = [token] if token in eos_ids else [token] + trie.scored_path(child, max_len - 1, min_prob / prob)[0]
        for i, tok in enumerate(branch):
            parents.append(ROOT if i == 0 else len(tokens) - 1)
            tokens.append(tok)
            if tok in eos_ids:
                break
    return tokens, parents


# A full store evicts down to this fraction of its budget: the trie (which cannot drop a response)
# is then rebuilt once per quarter budget of new responses, not after every one — a rebuild of
# the default 100,000 tokens takes ≈ 1.5 s, a stall of every request a server is running.
EVICT_TO = 0.75


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
        self.branches = branches  # > 1: a small tree, one continuation per frequent next token
        self.depth, self.factor, self.min_prob, self.store_tokens = depth, factor, min_prob, store_tokens
        self.store: deque[list[int]] = deque()  # earlier responses, oldest first
        self.global_trie = SuffixTrie(depth)
        self.local = SuffixTrie(depth)
        self.seen = 0
        self.response_start = 0
        self.share_live = False  # set on a pool's copies: the response joins the shared trie as it grows
        self.live: list[Node] = []  # this response's stream in the shared trie
        self.live_seen = -1  # context tokens inserted there (−1: none, not sharing)
        self.forget_global_matches()

    def forget_global_matches(self) -> None:
        """The global trie changed under this copy (a store rebuilt): re-walk at the next draft."""
        self.global_nodes: list[Node] = []  # suffix_nodes of the context's first global_seen tokens
        self.global_seen = -1

    def begin_query(self, prompt: Sequence[int]) -> None:
        self.local = SuffixTrie(self.depth)
        self.seen = 0
        self.response_start = len(prompt)
        self.live, self.live_seen = [], self.response_start if self.share_live else -1
        self.forget_global_matches()

    def forget_answers(self) -> None:
        """Drop every earlier response: a benchmark's timed run must not draft from the answers
        an earlier run (a warm-up, another batch size, a repeat) gave to the same prompts."""
        self.store.clear()
        self.global_trie = SuffixTrie(self.depth)
        self.forget_global_matches()

    def rejoin(self) -> None:
        """The shared trie was rebuilt without this query's response so far: insert it again."""
        self.forget_global_matches()
        if self.live_seen >= 0:
            self.live, self.live_seen = [], self.response_start

    def recover(self) -> None:
        self.begin_query(())  # the store of earlier responses stays
        self.live_seen = -1  # where this response stood is lost: it stops joining the shared trie

    def end_query(self, tokens: Sequence[int], prompt_len: int, inserted: bool = False) -> None:
        """Keep the response for later queries (``inserted``: a copy already put it in the trie
        while it grew — the store still records it, for rebuilds)."""
        response = list(tokens[prompt_len:])
        if not self.store_tokens or not response:
            return
        self.store.append(response[: self.store_tokens])
        stored = sum(map(len, self.store))
        if stored <= self.store_tokens:
            if not inserted:
                self.global_trie.add_sequence(self.store[-1])
            return
        while len(self.store) > 1 and stored > EVICT_TO * self.store_tokens:  # evict the oldest, rebuild once
            stored -= len(self.store.popleft())
        self.forget_global_matches()  # they were nodes of the old trie
        self.global_trie = SuffixTrie(self.depth)
        for response in self.store:
            self.global_trie.add_sequence(response)

    def _follow(self, context: Sequence[int]) -> None:
        """Bring this query's trie up to ``context`` (tokens only ever arrive at the end)."""
        if len(context) < self.seen:  # a context we have not followed: start over
            self.begin_query(context)
        self.local.extend(context[self.seen :])
        self.seen = len(context)
        if 0 <= self.live_seen < len(context):
            self.live = self.global_trie.grow(self.live, context[self.live_seen :])
            self.live_seen = len(context)

    def _global_matches(self, context: Sequence[int]) -> list[Node]:
        """``global_trie.suffix_nodes(context)``, advanced token by token from the last call's."""
        if self.global_trie.is_empty():
            return []
        nodes, seen = self.global_nodes, self.global_seen
        if seen < 0 or seen > len(context) or len(context) - seen > self.depth:
            nodes = self.global_trie.suffix_nodes(context)
        else:
            for token in context[seen:]:
                nodes = self.global_trie.advance(nodes, token)
            nodes = self.global_trie.lengthen(nodes, context)  # once: sequences added since
        self.global_nodes = nodes
        self.global_seen = len(context)
        return self.global_nodes

    def _best(self, context: Sequence[int], max_len: int) -> Candidate:
        """The best-scoring draft over every match in this query's trie, then the earlier responses'."""
        self._follow(context)
        local = best_candidate(self.local, self.local.active, max_len, self.factor, self.min_prob)
        return best_candidate(self.global_trie, self._global_matches(context), max_len, self.factor, self.min_prob,
                              local)

    def propose(self, context: Sequence[int], max_len: int, ctx: DraftContext, stop: Any = None) -> Draft:
        if max_len <= 0:
            self._follow(context)
            return Draft([])
        best = self._best(context, max_len)
        if best.trie is None:
            return Draft([])
        if self.branches > 1:
            tokens, parents = branching_continuations(best.trie, best.node, best.limit, self.min_prob, self.branches,
                                                      ctx.eos_ids)
            return Draft(tokens, None, parents) if parents.count(ROOT) > 1 else Draft(tokens)  # one branch: a chain
        tokens = best.tokens
        for i, token in enumerate(tokens):
            if token in ctx.eos_ids:
                return Draft(tokens[: i + 1])
        return Draft(tokens)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "depth": self.depth, "factor": self.factor,
                "min_prob": self.min_prob, "store_tokens": self.store_tokens, "branches": self.branches}


def forget_stored_answers(drafters: Iterable[Drafter]) -> None:
    """Empty the answer store of every suffix drafter among ``drafters`` (others are left alone):
    a benchmark's timed run starts cold, not drafting from a warm-up's or a repeat's answers."""
    for drafter in drafters:
        if isinstance(drafter, SuffixDrafter):
            drafter.forget_answers()
