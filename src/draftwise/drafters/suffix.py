"""SuffixDecoding-style drafter: a depth-bounded suffix trie with continuation counts.

Every suffix (up to ``depth`` tokens) of the token stream is a path in the trie, counted by how
often that substring occurred. The trie grows incrementally: each new token extends the stream's
current suffixes (no rebuild per token), and only those that occurred before need nodes (see
:class:`SuffixTrie`). A bounded global store of earlier responses gives matches across queries.

To draft (SuffixDecoding's scoring, Oliaro et al. 2024): every suffix of the context that occurs in
a trie is a candidate match; from each, follow the most frequent child while the path's estimated
probability (the product of ``child.count / node.count``) stays ≥ ``min_prob``, for at most
``factor × match length`` tokens; keep the candidate whose draft scores highest, the score being
the sum of its tokens' path probabilities (the expected number accepted). The deepest match is not
always best: in a depth-bounded trie a long match leaves few tokens below it, and a match seen once
says less than a shorter one seen often.
"""

from __future__ import annotations

import math
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from draftwise.drafters.base import DRAFTERS, Draft, DraftContext, Drafter
from draftwise.errors import DraftwiseError
from draftwise.verify.coupling import gumbel_value
from draftwise.verify.tree import ROOT

Node = int  # a trie node: its index in the trie's per-node lists (0: the root)
Location = int  # a node (≥ 0), or a point past a node along its one occurrence (< 0, see SuffixTrie)
ROOT_NODE: Node = 0
NO_CHILD = -1
_SHIFT = 32  # an edge's key: parent << 32 | token (token ids are below 2**32)
_PAST = 1 << 16  # a point `extra` tokens past node n: −1 − (n · 2**16 + extra)
NoiseOf = Callable[[int, int], float]  # (draft step, token) → that token's coupled noise there


@dataclass
class Stream:
    """A sequence growing in a trie: its id and the nodes of its current suffixes, shortest first
    (those that are nodes: see :class:`SuffixTrie`)."""

    sid: int
    nodes: list[Node] = field(default_factory=list)


class SuffixTrie:
    """Depth-bounded suffix trie over token streams, extended one token at a time.

    Every substring of at most ``depth`` tokens is a path, its count how often it occurred. Two
    economies keep it small and fast:

    - **Nodes are integers**: edges live in one dict keyed by ``parent << 32 | token``, each node's
      facts in flat lists. A trie of objects (a node with a dict of children) holds two
      garbage-collected containers per node, and the collector's passes over them took ¾ of the
      drafter's time (``benchmarks/suffix_cost.py``); ints and a dict of ints are never traversed.
    - **A substring seen once has no children**: below a node of count 1 the path is the rest of
      its one occurrence (stream ``seq``, ending at ``pos``), read from the stream itself. A node's
      children appear when its count reaches 2 (the first occurrence's next token becomes a node).
      So a token creates nodes only for its suffixes that occurred before, plus one, not for all
      ``depth`` of them; a point below a count-1 node is a :data:`Location` ``−1 − (n·2**16 + k)``
      (k tokens past node n).

    Counts, and so drafts, are those of the plain trie in which every suffix is a node.
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.edges: dict[int, Node] = {}
        self.count: list[int] = [0]
        self.token: list[int] = [-1]
        self.level: list[int] = [0]  # the substring's length
        self.seq: list[int] = [-1]  # where a count-1 substring occurred: stream id, position of its last token
        self.pos: list[int] = [-1]
        # The child to follow: the most frequent, the first created among equals (ids grow with
        # creation, so "first" is the smallest id) — what max() over the children in insertion
        # order gives. Counts only grow, so it is kept up to date as they do.
        self.best: list[Node] = [NO_CHILD]
        self.first: list[Node] = [NO_CHILD]  # children as a linked list, newest first
        self.sibling: list[Node] = [NO_CHILD]
        self.streams: list[list[int]] = []  # every sequence's tokens (count-1 paths are read there)
        # Streams that may still grow, by id: held weakly, so a finished query's stream (dropped
        # with its drafter copy) leaves no entry behind in a long-lived shared trie.
        self.growing: weakref.WeakValueDictionary[int, Stream] = weakref.WeakValueDictionary()
        self.own = self.new_stream()  # the stream :meth:`extend` grows (a query's own trie)

    @property
    def active(self) -> list[Node]:
        """The nodes of the own stream's current suffixes, shortest first."""
        return self.own.nodes

    def new_stream(self, growing: bool = True) -> Stream:
        stream = Stream(len(self.streams))
        self.streams.append([])
        if growing:
            self.growing[stream.sid] = stream
        return stream

    def extend(self, tokens: Sequence[int]) -> None:
        self.grow(self.own, tokens)

    def add_sequence(self, tokens: Sequence[int]) -> None:
        """Insert a separate sequence (its suffixes do not join the own stream)."""
        self.grow(self.new_stream(growing=False), tokens)

    def grow(self, stream: Stream, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to ``stream``: count each new suffix where its parent (the suffix one
        shorter, one token back) occurred twice or more; longer ones extend a substring seen once
        and need no node. The hot loop of every lookup-led round, written out."""
        edges, count, best, depth = self.edges, self.count, self.best, self.depth
        own = self.streams[stream.sid]
        for token in tokens:
            prev = stream.nodes  # may gain a node while we go (see _materialize)
            grown = []
            parent, length = ROOT_NODE, 1
            while True:
                child = edges.get(parent << _SHIFT | token)
                if child is None:
                    child = self._add(parent, token, stream.sid, len(own), length)
                else:
                    seen = count[child] = count[child] + 1
                    if seen == 2:
                        self._materialize(child)
                    lead = best[parent]  # the parent's child to follow: the most frequent, the first among equals
                    if lead != child and (lead == NO_CHILD or seen > count[lead]
                                          or (seen == count[lead] and child < lead)):
                        best[parent] = child
                grown.append(child)
                if length >= depth or length > len(prev):
                    break
                parent = prev[length - 1]
                if count[parent] < 2:
                    break  # seen once, here: what extends it is read from this stream
                length += 1
            own.append(token)
            stream.nodes = grown

    def _add(self, parent: Node, token: int, sid: int, pos: int, level: int) -> Node:
        node = self.edges[parent << _SHIFT | token] = len(self.count)
        self.count.append(1)
        self.token.append(token)
        self.level.append(level)
        self.seq.append(sid)
        self.pos.append(pos)
        self.best.append(NO_CHILD)
        self.first.append(NO_CHILD)
        self.sibling.append(self.first[parent])
        self.first[parent] = node
        if self.best[parent] == NO_CHILD:  # a new child (count 1, the newest) leads only a parent without one
            self.best[parent] = node
        return node

    def _materialize(self, node: Node) -> None:
        """``node`` just occurred a second time: its first occurrence's next token becomes a node
        (when it is already in — the end of a growing stream's tokens extends the usual way)."""
        sid, pos, level = self.seq[node], self.pos[node], self.level[node]
        tokens = self.streams[sid]
        if level >= self.depth or pos + 1 >= len(tokens):
            return
        child = self._add(node, tokens[pos + 1], sid, pos + 1, level + 1)
        stream = self.growing.get(sid)
        if pos + 2 == len(tokens) and stream is not None and len(stream.nodes) == level:
            stream.nodes.append(child)  # a suffix of that stream's end is a node now

    # -- locations: a node, or a point below a count-1 node ----------------------------------
    @staticmethod
    def _split(loc: Location) -> tuple[Node, int]:
        if loc >= 0:
            return loc, 0
        return divmod(-1 - loc, _PAST)

    def _fresh(self, loc: Location) -> Location:
        """``loc`` as it reads now: a point below a node that has since occurred again is a node
        (or a point below a deeper one)."""
        node, extra = self._split(loc)
        if extra == 0 or self.count[node] == 1:
            return loc
        start = self.pos[node] + 1
        loc = node
        for token in self.streams[self.seq[node]][start : start + extra]:
            step = self.step(loc, token)  # the path exists: these tokens occurred
            assert step is not None, "a path that occurred is in the trie"
            loc = step
        return loc

    def step(self, loc: Location, token: int) -> Location | None:
        """The location after ``token``; None where the path ends."""
        node, extra = self._split(self._fresh(loc))
        if extra == 0 and self.count[node] != 1:  # the root, or seen twice or more: children are nodes
            return self.edges.get(node << _SHIFT | token)
        onward = self._onward(node, extra)
        return onward[1] if onward is not None and onward[0] == token else None

    def _onward(self, node: Node, extra: int) -> tuple[int, Location] | None:
        """Below a count-1 node: the next token of its one occurrence after ``extra`` more, and
        the point it leads to; None at the stream's end or the trie's depth."""
        at = self.pos[node] + extra + 1
        tokens = self.streams[self.seq[node]]
        if at < len(tokens) and self.level[node] + extra < self.depth:
            return tokens[at], -1 - (node * _PAST + extra + 1)
        return None

    def count_at(self, loc: Location) -> int:
        loc = self._fresh(loc)
        return self.count[loc] if loc >= 0 else 1

    def children(self, loc: Location) -> list[tuple[int, Location]]:
        """``(token, location)`` of every continuation, in the order they first occurred."""
        loc = self._fresh(loc)
        node, extra = self._split(loc)
        if extra == 0 and self.count[node] != 1:
            out = []
            child = self.first[node]
            while child != NO_CHILD:
                out.append((self.token[child], child))
                child = self.sibling[child]
            return out[::-1]
        onward = self._onward(node, extra)
        return [onward] if onward is not None else []

    def is_empty(self) -> bool:
        return self.best[ROOT_NODE] == NO_CHILD

    def suffix_nodes(self, context: Sequence[int]) -> list[Location]:
        """The locations of ``context``'s suffixes that occur here, shortest first (walked from the
        root). Every substring of a stored sequence is a path, so if the suffix of length m is
        missing so is every longer one: the list holds the lengths 1..m−1 exactly.
        """
        nodes: list[Location] = []
        for length in range(1, min(self.depth, len(context)) + 1):
            loc = self._walk(context[len(context) - length :])
            if loc is None:
                break
            nodes.append(loc)
        return nodes

    def advance(self, nodes: list[Location], token: int) -> list[Location]:
        """The shortest suffix locations of ``context + [token]`` from ``nodes``, those of
        ``context``: exact where ``nodes`` was, possibly short where the trie has grown since
        (:meth:`lengthen`)."""
        edges = self.edges
        first = edges.get(token)  # the root's child
        if first is None:
            return []
        out = [first]
        # :meth:`step` for each location, written out: this loop runs for every suffix of every
        # new token of every request (vLLM's proposer pays it per request and step)
        count, pos, seq, level, streams, depth = self.count, self.pos, self.seq, self.level, self.streams, self.depth
        for loc in nodes[: depth - 1]:
            if loc < 0:
                node, extra = divmod(-1 - loc, _PAST)
                if count[node] != 1:  # the point's node occurred again since: read it as it is now
                    node, extra = self._split(self._fresh(loc))
            else:
                node, extra = loc, 0
            if extra == 0 and count[node] != 1:
                nxt = edges.get(node << _SHIFT | token)
                if nxt is None:
                    break  # that suffix is missing now, so is every longer one
            else:  # below a count-1 node: the rest of its one occurrence
                at = pos[node] + extra + 1
                tokens = streams[seq[node]]
                if at >= len(tokens) or level[node] + extra >= depth or tokens[at] != token:
                    break
                nxt = -1 - (node * _PAST + extra + 1)
            out.append(nxt)
        return out

    def lengthen(self, nodes: list[Location], context: Sequence[int]) -> list[Location]:
        """``suffix_nodes(context)`` from its shortest ``nodes``: the longer ones a sequence added
        since may have created, walked from the root."""
        while len(nodes) < min(self.depth, len(context)):
            longer = self._walk(context[len(context) - len(nodes) - 1 :])
            if longer is None:
                break
            nodes = [*nodes, longer]
        return nodes

    def _walk(self, path: Sequence[int]) -> Location | None:
        loc: Location | None = ROOT_NODE
        for token in path:
            loc = self.step(loc, token)  # type: ignore[arg-type]
            if loc is None:
                return None
        return loc

    def scored_path(self, loc: Location, max_len: int, min_prob: float,
                    noise: NoiseOf | None = None) -> tuple[list[int], float]:
        """Follow the most frequent child while the path's probability (Π child.count / node.count)
        stays ≥ ``min_prob``: the tokens and their summed probabilities (the draft's score).
        Below a count-1 node every step has probability 1: the rest of its one occurrence.
        Given ``noise`` (coupled sampling), a node with several children follows the Gumbel-max of
        their counts with the noise the target's draw will use at that step
        (:meth:`coupled_child`), not the most frequent.

        >>> trie = SuffixTrie(4)
        >>> trie.add_sequence([1, 2, 3, 1, 2, 4, 1])  # "1 2" twice: then 3 once, 4 once
        >>> trie.scored_path(trie.suffix_nodes([1, 2])[-1], 3, 0.1)
        ([3, 1], 1.0)
        """
        count, best = self.count, self.best
        if loc >= 0:  # _split(_fresh(loc)), its common cases written out
            node, extra = loc, 0
        else:
            node, extra = divmod(-1 - loc, _PAST)
            if count[node] != 1:
                node, extra = self._split(self._fresh(loc))
        tokens: list[int] = []
        prob, score = 1.0, 0.0
        while extra == 0 and count[node] != 1 and len(tokens) < max_len:
            child = best[node] if noise is None else self.coupled_child(node, len(tokens), noise)
            if child == NO_CHILD:
                return tokens, score
            prob *= count[child] / count[node]
            if prob < min_prob:
                return tokens, score
            tokens.append(self.token[child])
            score += prob
            node = child
        room = min(max_len - len(tokens), self.depth - self.level[node] - extra)
        if room > 0:
            at = self.pos[node] + extra + 1
            rest = self.streams[self.seq[node]][at : at + room]
            tokens += rest
            score += prob * len(rest)
        return tokens, score

    def coupled_child(self, node: Node, step: int, noise: NoiseOf) -> Node:
        """The child x maximising log count(x) + g(x): a draw from the counts' distribution coupled
        with the target's own draw at this step, so the draft goes where the target's noise leads
        wherever the counts resemble the target's distribution (an only child: no noise read)."""
        child = self.first[node]
        if child == NO_CHILD or self.sibling[child] == NO_CHILD:
            return child
        best, best_score = NO_CHILD, -math.inf
        while child != NO_CHILD:
            score = math.log(self.count[child]) + noise(step, self.token[child])
            if score > best_score:
                best, best_score = child, score
            child = self.sibling[child]
        return best


@dataclass
class Candidate:
    """The best-scoring draft so far: its trie and match's location, draft budget, tokens and score."""

    trie: SuffixTrie | None = None
    node: Location = ROOT_NODE
    limit: int = 0
    tokens: list[int] = field(default_factory=list)
    score: float = 0.0
    match: int = 0  # the context's last tokens matched


def best_candidate(trie: SuffixTrie, nodes: Sequence[Location], max_len: int, factor: float, min_prob: float,
                   best: Candidate | None = None, noise: NoiseOf | None = None) -> Candidate:
    """Score a draft from every match in ``nodes`` (``nodes[m-1]``: the context's last m tokens),
    longest first, and keep the best (ties: the one already held, else the longer match). A match
    of length m drafts at most ``factor × m`` tokens and, in a depth-bounded trie, ``depth − m``;
    a score never exceeds its budget, so budgets below the best score are skipped unwalked."""
    best = best if best is not None else Candidate()
    for length in range(len(nodes), 0, -1):
        cap = min(max_len, int(factor * length + 1e-9))
        if cap <= best.score:
            break  # shorter matches have smaller caps still
        loc = nodes[length - 1]
        limit = min(cap, trie.depth - length)
        if limit <= best.score:
            continue
        tokens, score = trie.scored_path(loc, limit, min_prob, noise)
        if score > best.score:
            best = Candidate(trie, loc, limit, tokens, score, length)
    return best


def branching_continuations(trie: SuffixTrie, loc: Location, max_len: int, min_prob: float, branches: int,
                            eos_ids: frozenset[int]) -> tuple[list[int], list[int]]:
    """Up to ``branches`` continuations as a tree (point masses): each of the most frequent next
    tokens (estimated probability ≥ min_prob, the first always) followed as
    :meth:`SuffixTrie.scored_path` does; parents −1 = root."""
    total = trie.count_at(loc)
    ranked = sorted(trie.children(loc), key=lambda item: -trie.count_at(item[1]))[:branches]
    tokens: list[int] = []
    parents: list[int] = []
    for rank, (token, child) in enumerate(ranked):
        prob = trie.count_at(child) / total
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
        coupled: bool = False,
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
        # under coupled sampling, branch where the target's noise leads (SuffixTrie.coupled_child): more
        # drafts accepted on the dev split, none faster on either set (BENCHMARKS.md, "Sampled"), so off
        self.coupled = coupled
        self.depth, self.factor, self.min_prob, self.store_tokens = depth, factor, min_prob, store_tokens
        self.store: deque[list[int]] = deque()  # earlier responses, oldest first
        self.global_trie = SuffixTrie(depth)
        self.local = SuffixTrie(depth)
        self.seen = 0
        self.response_start = 0
        self.share_live = False  # set on a pool's copies: the response joins the shared trie as it grows
        self.live: Stream | None = None  # this response's stream in the shared trie
        self.live_seen = -1  # context tokens inserted there (−1: none, not sharing)
        self.forget_global_matches()

    def forget_global_matches(self) -> None:
        """The global trie changed under this copy (a store rebuilt): re-walk at the next draft."""
        self.global_nodes: list[Location] = []  # suffix_nodes of the context's first global_seen tokens
        self.global_seen = -1

    def begin_query(self, prompt: Sequence[int]) -> None:
        self.local = SuffixTrie(self.depth)
        self.seen = 0
        self.response_start = len(prompt)
        self.live, self.live_seen = None, self.response_start if self.share_live else -1
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
            self.live, self.live_seen = None, self.response_start

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
            if self.live is None:
                self.live = self.global_trie.new_stream()
            self.global_trie.grow(self.live, context[self.live_seen :])
            self.live_seen = len(context)

    def _global_matches(self, context: Sequence[int]) -> list[Location]:
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

    def _best(self, context: Sequence[int], max_len: int, noise: NoiseOf | None = None) -> Candidate:
        """The best-scoring draft over every match in this query's trie, then the earlier responses'."""
        self._follow(context)
        local = best_candidate(self.local, self.local.active, max_len, self.factor, self.min_prob, noise=noise)
        return best_candidate(self.global_trie, self._global_matches(context), max_len, self.factor, self.min_prob,
                              local, noise)

    def propose(self, context: Sequence[int], max_len: int, ctx: DraftContext, stop: Any = None) -> Draft:
        if max_len <= 0:
            self._follow(context)
            return Draft([])
        best = self._best(context, max_len, _draft_noise(ctx, len(context)) if self.coupled else None)
        if best.trie is None:
            return Draft([])
        if self.branches > 1:
            tokens, parents = branching_continuations(best.trie, best.node, best.limit, self.min_prob, self.branches,
                                                      ctx.eos_ids)
            return Draft(tokens, None, parents) if parents.count(ROOT) > 1 else Draft(tokens)  # one branch: a chain
        tokens = best.tokens
        for i, token in enumerate(tokens):
            if token in ctx.eos_ids:
                return Draft(tokens[: i + 1], match=best.match)
        return Draft(tokens, match=best.match)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "depth": self.depth, "factor": self.factor,
                "min_prob": self.min_prob, "store_tokens": self.store_tokens, "branches": self.branches,
                "coupled": self.coupled}


def _draft_noise(ctx: DraftContext, start: int) -> NoiseOf | None:
    """Under coupled sampling, draft step j's noise for a token: the target's own noise at position
    ``start + j`` (``start``: the context's length, where the draft begins — also when the
    evaluation phase asks what this drafter would have proposed along verified tokens)."""
    noise = ctx.noise
    return None if noise is None else (lambda step, token: gumbel_value(noise.seed, start + step, token))


def forget_stored_answers(drafters: Iterable[Drafter]) -> None:
    """Empty the answer store of every drafter among ``drafters`` that keeps one (``suffix``,
    ``arctic-suffix``; others are left alone): a benchmark's timed run starts cold, not drafting
    from a warm-up's or a repeat's answers."""
    for drafter in drafters:
        forget = getattr(drafter, "forget_answers", None)
        if forget is not None:
            forget()
