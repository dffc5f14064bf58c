"""Draft trees: shape, attention mask, positions, and lossless verification (pure functions).

A tree of n nodes is ``tokens[i]`` with ``parents[i]`` (−1 = the root, i.e. the verified
context), in topological order (a parent before its children). Node i at depth d (depth 1 = a
child of the root) continues the context by the tokens of its root-to-node path, so its position
is ``len(context) + d − 1`` and it may attend to the context and its ancestors only.

Row convention: the target's logits for a tree have n + 1 rows, row 0 after the context (it
predicts the root's children) and row i + 1 after node i (it predicts node i's children).

Verification walks the tree from the root. At each node the children are tried in order:

* greedy — the child equal to the target's argmax, if any;
* sampling — recursive rejection sampling (SpecInfer / SpecTr): accept child x with probability
  min(1, r(x) / q(x)) against the current residual r (initially the target p); on rejection
  r ← norm(max(0, r − q)) and the next sibling is tried; when all fail, the token is sampled from
  the last residual. A point-mass child (q = one-hot) is accepted with probability r(x), and its
  rejection zeroes x in r. Lossless when each child, given its earlier siblings and the path, is
  a draw from its q (or any fixed token for point masses) independent of the target's coins.

Per level, the probability that *some* child is accepted given the children is
1 − Π_j (1 − a_j) with a_j the acceptance probability of child j against its residual (the
residuals do not depend on which child was rejected, only on the q's). For point-mass children
this is the target mass of the children (HedgeSpec Theorem 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from draftwise.errors import DraftwiseError
from draftwise.verify.draft import Draft

ROOT = -1


@dataclass(frozen=True)
class TreeVerdict:
    """What verification of a tree accepted: a root-to-node path, then one target token."""

    path: list[int]  # accepted node indices, root to node
    next_token: int  # the target's correction or bonus token after the path
    accept_probs: list[float]  # per level along the path (then the drafter's first branch): P(some child accepted)

    @property
    def accepted(self) -> int:
        return len(self.path)

    @property
    def rows(self) -> list[int]:
        """Rows of the tree's target logits at each verified position (0 = after the context)."""
        return [0] + [i + 1 for i in self.path]


# -- shape ---------------------------------------------------------------------------------------
def check_tree(tokens: Sequence[int], parents: Sequence[int]) -> None:
    """Raise :class:`DraftwiseError` unless ``parents`` describes a tree over ``tokens`` in topological order."""
    if len(tokens) != len(parents):
        raise DraftwiseError(f"a draft tree needs one parent per node: {len(tokens)} tokens, {len(parents)} parents")
    for i, parent in enumerate(parents):
        if not ROOT <= parent < i:
            raise DraftwiseError(f"draft tree node {i} has parent {parent}; parents must be −1 or an earlier node")


def tree_depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node (1 = child of the root).

    >>> tree_depths([-1, -1, 0, 2, 1])
    [1, 1, 2, 3, 2]
    """
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent == ROOT else depths[parent] + 1)
    return depths


def tree_children(parents: Sequence[int]) -> list[list[int]]:
    """Children by row: ``out[0]`` the root's, ``out[i + 1]`` node i's, each in node order.

    >>> tree_children([-1, -1, 0])
    [[0, 1], [2], [], []]
    """
    out: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, parent in enumerate(parents):
        out[parent + 1].append(i)
    return out


def path_to(node: int, parents: Sequence[int]) -> list[int]:
    """Node indices from the root's child down to ``node``.

    >>> path_to(3, [-1, -1, 0, 2])
    [0, 2, 3]
    """
    path: list[int] = []
    while node != ROOT:
        path.append(node)
        node = parents[node]
    return path[::-1]


def match_path(tokens: Sequence[int], parents: Sequence[int], continuation: Sequence[int]) -> list[int]:
    """The longest root path whose tokens are a prefix of ``continuation``.

    Siblings may repeat a token (a sampled tree), so every matching child is followed.

    >>> match_path([5, 6, 7, 8], [-1, -1, 1, 2], [6, 7, 9])
    [1, 2]
    >>> match_path([6, 6, 7], [-1, -1, 1], [6, 7])
    [1, 2]
    """
    children = tree_children(parents)
    best: list[int] = []
    stack: list[list[int]] = [[]]
    while stack:
        path = stack.pop()
        if len(path) > len(best):
            best = path
        if len(path) < len(continuation):
            row = path[-1] + 1 if path else 0
            stack.extend(path + [c] for c in children[row] if tokens[c] == continuation[len(path)])
    return best


def prune_depth(parents: Sequence[int], max_depth: int) -> list[int]:
    """Indices of the nodes at depth ≤ ``max_depth`` (kept in order; a subtree-closed selection)."""
    return [i for i, d in enumerate(tree_depths(parents)) if d <= max_depth]


def select_nodes(parents: Sequence[int], keep: Sequence[int]) -> list[int]:
    """Parents re-indexed for the sub-tree of the (ancestor-closed, ordered) nodes ``keep``."""
    where = {old: new for new, old in enumerate(keep)}
    return [ROOT if parents[i] == ROOT else where[parents[i]] for i in keep]


# -- attention ------------------------------------------------------------------------------------
def ancestor_matrix(parents: Sequence[int]) -> torch.Tensor:
    """(n, n) bool: ``[i, j]`` is True when j is i or an ancestor of i.

    >>> ancestor_matrix([-1, 0, -1]).int().tolist()
    [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    """
    n = len(parents)
    out = torch.zeros(n, n, dtype=torch.bool, device="cpu")  # built row by row: on the CPU, moved by the caller
    for i, parent in enumerate(parents):
        out[i, i] = True
        if parent != ROOT:  # topological order: the parent's row is complete
            out[i] |= out[parent]
    return out


def tree_attention_mask(parents: Sequence[int], cached: int, fresh: int, new_from: int = 0) -> torch.Tensor:
    """Which keys each query may see, (fresh + n − new_from, cached + fresh + n) bool.

    Keys are laid out as the cache will hold them: ``cached`` context tokens already in the cache,
    ``fresh`` context tokens fed now, then the n tree nodes (nodes before ``new_from`` are already
    cached too — a tree grown level by level). Queries are the fresh context tokens (causal) then
    the new nodes, which see the whole context and exactly their ancestors and themselves.
    """
    n = len(parents)
    context = cached + fresh
    queries = fresh + n - new_from
    mask = torch.zeros(queries, context + n, dtype=torch.bool, device="cpu")  # small: the caller moves it
    if fresh:
        mask[:fresh, :context] = torch.ones(fresh, context, dtype=torch.bool, device="cpu").tril(diagonal=cached)
    mask[fresh:, :context] = True
    mask[fresh:, context:] = ancestor_matrix(parents)[new_from:]
    return mask


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A bool (q, k) mask as the (1, 1, q, k) additive float mask transformers' attention takes.

    Additive rather than bool because the eager attention path adds the mask to the scores; the
    SDPA path accepts either.
    """
    blocked = torch.finfo(dtype).min
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, blocked)
    return mask[None, None].to(device)


def tree_positions(parents: Sequence[int], base: int) -> list[int]:
    """Position ids of the nodes hanging from a context of ``base`` tokens (depth-based).

    >>> tree_positions([-1, -1, 0], 10)
    [10, 10, 11]
    """
    return [base + d - 1 for d in tree_depths(parents)]


# -- verification ---------------------------------------------------------------------------------
def _first_branch(children: list[list[int]], row: int) -> list[int]:
    """Rows down the drafter's first branch below ``row`` (its preferred continuation)."""
    rows = []
    while children[row]:
        row = children[row][0] + 1
        rows.append(row)
    return rows


def verify_tree_greedy(tokens: Sequence[int], parents: Sequence[int], target_logits: torch.Tensor,
                       choice: Sequence[int] | None = None) -> TreeVerdict:
    """Accept the longest root path whose tokens equal the target's argmax, then its next argmax.

    ``target_logits`` is (n + 1, V) in the row convention of this module. Levels record 1 when a
    child matched; after the path ends they continue down the first branch (conditioned on the
    draft, as the chain's per-position probabilities are).
    """
    if choice is None:  # argmax's answer, cheaper (draftwise.verify.chain.verify_greedy)
        choice = target_logits.max(-1).indices.tolist()
    children = tree_children(parents)
    path: list[int] = []
    probs: list[float] = []
    row = 0
    while children[row]:
        child = next((c for c in children[row] if tokens[c] == choice[row]), None)
        probs.append(0.0 if child is None else 1.0)
        if child is None:
            break
        path.append(child)
        row = child + 1
    if probs and probs[-1] == 0.0:
        for below in _first_branch(children, row):
            if children[below]:
                probs.append(float(any(tokens[c] == choice[below] for c in children[below])))
    return TreeVerdict(path, choice[row], probs)


def rejection_chain(p: torch.Tensor, kids: Sequence[int], q: Sequence[torch.Tensor | None],
                    tokens: Sequence[int]) -> tuple[list[float], list[torch.Tensor]]:
    """Acceptance probability of each child against its residual, and the residuals.

    ``residuals[j]`` is the distribution child j is judged against (``residuals[0] = p``) and
    ``residuals[-1]`` what is sampled from when every child is rejected. ``q[j]`` None = point mass.
    """
    residual = p
    accepts: list[float] = []
    residuals = [p]
    for child, q_child in zip(kids, q):
        x = tokens[child]
        if q_child is None:  # q = one-hot at x: accept with r(x); the rejection removes x
            accepts.append(float(residual[x]))
            residual = residual.clone()
            residual[x] = 0.0
        else:
            accepts.append(min(1.0, float(residual[x] / q_child[x])) if float(q_child[x]) > 0 else 0.0)
            residual = (residual - q_child).clamp(min=0.0)
        total = residual.sum()
        # no mass left means the rejection had probability 0 (r ≤ q everywhere): keep r (guard only)
        residual = residual / total if total > 0 else residuals[-1]
        residuals.append(residual)
    return accepts, residuals


def level_acceptance(accepts: Sequence[float]) -> float:
    """P(some child accepted) = 1 − Π (1 − a_j).

    >>> level_acceptance([0.5, 0.5])
    0.75
    """
    miss = 1.0
    for a in accepts:
        miss *= 1.0 - a
    return 1.0 - miss


def verify_tree_sampling(
    tokens: Sequence[int],
    parents: Sequence[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> TreeVerdict:
    """Recursive rejection sampling down the tree; lossless (see the module docstring).

    ``draft_probs`` (n, V): the distribution each node was drawn from given its earlier siblings
    (None: every node is a point mass). ``target_probs`` (n + 1, V) warped target rows.
    """
    children = tree_children(parents)
    path: list[int] = []
    probs: list[float] = []
    row = 0
    device = target_probs.device

    def q_of(kids: list[int]) -> list[torch.Tensor | None]:
        return [None if draft_probs is None else draft_probs[c] for c in kids]

    while True:
        kids = children[row]
        accepts, residuals = rejection_chain(target_probs[row], kids, q_of(kids), tokens)
        if kids:
            probs.append(level_acceptance(accepts))
        chosen = None
        for j, child in enumerate(kids):
            if float(torch.rand(1, generator=generator, device=device)) < accepts[j]:
                chosen = child
                break
        if chosen is None:  # all rejected (or a leaf: the bonus token from p itself)
            token = int(torch.multinomial(residuals[-1], 1, generator=generator))
            break
        path.append(chosen)
        row = chosen + 1
    if kids:  # rejected at a level: continue down the first branch, conditioned on the draft
        for below in _first_branch(children, row):
            if children[below]:
                accepts, _ = rejection_chain(target_probs[below], children[below], q_of(children[below]), tokens)
                probs.append(level_acceptance(accepts))
    return TreeVerdict(path, token, probs)


# -- building trees --------------------------------------------------------------------------------
@dataclass
class Candidate:
    """A node proposed while growing a tree: token, parent candidate, cumulative log-probability."""

    token: int
    parent: int  # candidate index, −1 = root
    score: float
    depth: int
    expanded: bool = False


@dataclass
class CandidateTree:
    """Candidates grown level by level; :meth:`best` keeps the top ones as a tree (EAGLE-2's rerank)."""

    nodes: list[Candidate] = field(default_factory=list)

    def add(self, token: int, parent: int, score: float) -> int:
        depth = 1 if parent == ROOT else self.nodes[parent].depth + 1
        self.nodes.append(Candidate(token, parent, score, depth))
        return len(self.nodes) - 1

    def best(self, budget: int) -> list[int]:
        """Indices of the ``budget`` highest-scoring candidates, in topological order.

        Scores are cumulative log-probabilities, so a child never outscores its parent; ties are
        broken towards shallower nodes, which keeps the selection ancestor-closed.
        """
        order = sorted(range(len(self.nodes)), key=lambda i: (-self.nodes[i].score, self.nodes[i].depth, i))
        return sorted(order[:budget])

    def as_tree(self, keep: Sequence[int]) -> tuple[list[int], list[int]]:
        """Tokens and parents of the kept candidates (ancestor-closed, in index order)."""
        parents = [self.nodes[i].parent for i in range(len(self.nodes))]
        return [self.nodes[i].token for i in keep], select_nodes(parents, keep)


def parse_shape(text: str) -> tuple[int, ...]:
    """Branching factors per depth, ``"4x2x1"`` → (4, 2, 1).

    >>> parse_shape("3x2x1")
    (3, 2, 1)
    """
    try:
        shape = tuple(int(part) for part in text.replace("*", "x").split("x") if part.strip())
    except ValueError:
        raise DraftwiseError(f"tree shape {text!r}: expected branching factors per depth such as 4x2x1") from None
    if not shape or min(shape) < 1:
        raise DraftwiseError(f"tree shape {text!r}: every branching factor must be ≥ 1")
    return shape


def chain_parents(n: int) -> list[int]:
    """A chain of ``n`` tokens as a tree: each node's parent is the one before it.

    >>> chain_parents(3)
    [-1, 0, 1]
    """
    return [ROOT + i for i in range(n)]


def union_of(drafts: Sequence[Draft]) -> Draft:
    """Point-mass drafts (chains or trees) merged into one trie: shared prefixes once, each
    distinct continuation a branch; a single path comes back as a chain. Verification then accepts
    the longest branch the target agrees with, so several lookups cost one forward per round.

    >>> union_of([Draft([1, 2, 3]), Draft([1, 2])]).tokens
    [1, 2, 3]
    >>> d = union_of([Draft([1, 2, 3]), Draft([1, 4])])
    >>> d.tokens, d.parents
    ([1, 2, 3, 4], [-1, 0, 1, 0])
    """
    tokens: list[int] = []
    parents: list[int] = []
    index: dict[tuple[int, int], int] = {}  # (parent node, token) → node
    for draft in drafts:
        own = draft.parents if draft.parents is not None else chain_parents(len(draft.tokens))
        mapped: list[int] = []
        for token, parent in zip(draft.tokens, own):
            key = (ROOT if parent == ROOT else mapped[parent], token)
            if key not in index:
                index[key] = len(tokens)
                tokens.append(token)
                parents.append(key[0])
            mapped.append(index[key])
    if parents == chain_parents(len(parents)):
        return Draft(tokens)
    return Draft(tokens, None, parents)


def fit_tree(draft: Draft, max_depth: int) -> Draft:
    """A drafter's tree checked and cut to ``max_depth`` (the round's draft budget); an empty tree is an empty chain."""
    parents = draft.parents if draft.parents is not None else chain_parents(len(draft.tokens))
    check_tree(draft.tokens, parents)
    if not draft.tokens:
        return Draft([])
    keep = prune_depth(parents, max_depth)
    if len(keep) == len(draft.tokens):
        return draft
    probs = None if draft.probs is None else draft.probs[keep]
    return Draft([draft.tokens[i] for i in keep], probs, select_nodes(parents, keep))
