"""How a model drafter turns its next-token distribution into a draft: a chain, or a tree.

Pure of any drafter: each function takes the drafter's logits after the context and a callback
that feeds tokens to it. LM drafters (:mod:`draftwise.drafters.lm`) and white-box heads
(:mod:`draftwise.drafters.eagle`, :mod:`draftwise.drafters.medusa`) share them, as does the
evaluation phase's counterfactual acceptance.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from draftwise.drafters.stopping import StopRule
from draftwise.errors import DraftwiseError
from draftwise.verify.chain import Sampling, top1_hits, warp
from draftwise.verify.coupling import coupled_scores
from draftwise.verify.draft import Draft, DraftContext
from draftwise.verify.tree import ROOT, CandidateTree, parse_shape

TREE_KINDS = ("", "chain", "dynamic", "static", "sampled")
DYNAMIC_BUDGET = 16  # nodes of a dynamic tree when no budget is given (EAGLE-2 uses 60 on GPUs)

# Feeds tree nodes (tokens, parents indexing the nodes fed so far, −1 = root) to the drafter and
# returns its distribution after each of them, (len(tokens), V).
Expand = Callable[[list[int], list[int]], torch.Tensor]


@dataclass(frozen=True)
class TreeOptions:
    """How an LM drafter shapes its draft.

    * ``chain`` (default): one token per position.
    * ``dynamic``: EAGLE-2's dynamic tree — at each depth expand the ``topk`` most probable nodes
      (cumulative drafter probability) with their ``topk`` most probable children, then keep the
      ``budget`` most probable nodes. Verified as point masses (the nodes are chosen for their
      probability, so they are not draws from q); under sampling a level's acceptance is the
      target mass of the children.
    * ``static``: a fixed ``shape`` of branching factors per depth, top-b children of every node.
    * ``sampled``: the same shape, children drawn *without replacement* from the drafter's warped
      distribution; verified by recursive rejection sampling against each node's q (under greedy
      decoding it is ``static``).

    ``depth`` caps the depth (0 = the arm's draft length, which always caps it).
    """

    kind: str = "chain"
    topk: int = 4
    budget: int = 0  # 0: DYNAMIC_BUDGET for dynamic trees, no cap for shaped ones
    depth: int = 0
    shape: tuple[int, ...] = (2, 2, 1, 1)

    @classmethod
    def parse(cls, tree: str = "", topk: int = 4, budget: int = 0, depth: int = 0, shape: str = "") -> TreeOptions:
        kind = tree or "chain"
        if kind not in TREE_KINDS:
            raise DraftwiseError(f"unknown tree kind {tree!r}; valid: chain, dynamic, static, sampled")
        if topk < 1 or budget < 0 or depth < 0:
            raise DraftwiseError(f"tree options: need topk ≥ 1, budget ≥ 0, depth ≥ 0 (got {topk}, {budget}, {depth})")
        if shape and kind not in ("static", "sampled"):
            raise DraftwiseError(f"tree shape applies to static and sampled trees, not {kind!r}")
        return cls(kind, topk, budget, depth, parse_shape(shape) if shape else cls.shape)

    @property
    def first_width(self) -> int:
        """Children of the root: the tree's width at the first draft position."""
        return {"chain": 1, "dynamic": self.topk}.get(self.kind, self.shape[0])


def counterfactual_acceptance(q_logits: torch.Tensor, choice: torch.Tensor, target_probs: torch.Tensor | None,
                              sampling: Sampling, width: int = 1, point_mass: bool = False) -> list[float]:
    """Per position: would this drafter's first level have been accepted?

    Chain (width 1, sampled from q): greedy 1[argmax q = argmax p], sampling 1 − TV(p, q).
    Tree with ``width`` children at the first level, taken as point masses: greedy 1[argmax p among
    the top-``width`` of q], sampling the target mass of those tokens (HedgeSpec Theorem 2). A
    ``sampled`` tree draws its children at random; it is scored like its top-``width`` (a stand-in
    for the expectation over the draws).
    """
    if not point_mass and width == 1:
        if target_probs is None:
            return top1_hits(q_logits, choice).float().tolist()
        return torch.minimum(target_probs, warp(q_logits, sampling)).sum(-1).tolist()
    q = _scores(q_logits, sampling)
    top = torch.topk(q, min(width, q.shape[-1]), dim=-1)
    if target_probs is None:
        return ((top.indices == choice[:, None]) & (top.values > 0)).any(-1).float().tolist()
    mass = target_probs.gather(-1, top.indices) * (top.values > 0)
    return mass.sum(-1).tolist()


def _scores(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The drafter's distribution used to rank children: warped under sampling, softmax under greedy."""
    return torch.softmax(logits.float(), -1) if sampling.greedy else warp(logits, sampling)


def _top(probs: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The k most probable tokens with nonzero probability, most probable first."""
    values, index = torch.topk(probs, min(k, probs.shape[-1]))
    return [(int(i), float(v)) for v, i in zip(values.tolist(), index.tolist()) if v > 0]


def grow_dynamic(root: torch.Tensor, expand: Expand, topk: int, budget: int, depth: int,
                 eos_ids: frozenset[int]) -> tuple[list[int], list[int]]:
    """EAGLE-2's dynamic draft tree from the drafter's distribution ``root`` after the context.

    Each depth expands the ``topk`` best candidates of the previous depth (one batched drafter
    forward), adding their ``topk`` best children; the tree is the ``budget`` best candidates by
    cumulative log-probability. EOS candidates are not expanded.
    """
    cands = CandidateTree()
    level = [cands.add(tok, ROOT, math.log(p)) for tok, p in _top(root, topk)]
    fed: dict[int, int] = {}  # candidate index → index among the nodes fed to the drafter
    for _ in range(depth - 1):
        frontier = sorted((c for c in level if cands.nodes[c].token not in eos_ids),
                          key=lambda c: -cands.nodes[c].score)[:topk]
        if not frontier:
            break
        rows = expand([cands.nodes[c].token for c in frontier],
                      [fed.get(cands.nodes[c].parent, ROOT) for c in frontier])
        level = []
        for c, probs in zip(frontier, rows):
            fed[c] = len(fed)
            level.extend(cands.add(tok, c, cands.nodes[c].score + math.log(p)) for tok, p in _top(probs, topk))
    return cands.as_tree(cands.best(budget))


def grow_shaped(root: torch.Tensor, expand: Expand, shape: Sequence[int], budget: int, eos_ids: frozenset[int],
                generator: torch.Generator | None = None,
                noise: Callable[[int], torch.Tensor] | None = None) -> tuple[list[int], list[int], list[torch.Tensor]]:
    """A tree of fixed branching factors per depth, in breadth-first order, cut at ``budget`` nodes.

    Children are the top-b tokens of the drafter's distribution, or, given a ``generator``, b draws
    without replacement (Gumbel top-k), or, given ``noise`` (depth → Gumbel row; coupled sampling),
    the top-b of ``log q + g``: the first child is the drafter's coupled draw. Returns tokens,
    parents, and each node's proposal distribution given its earlier siblings (q with their tokens
    removed, renormalised).
    """
    tokens: list[int] = []
    parents: list[int] = []
    qs: list[torch.Tensor] = []
    fed: dict[int, int] = {}
    frontier, dists = [ROOT], [root]
    for d, width in enumerate(shape):
        level: list[int] = []
        for parent, probs in zip(frontier, dists):
            for tok, q in _children(probs, width, generator, None if noise is None else noise(d)):
                if len(tokens) >= budget:
                    break
                tokens.append(tok)
                parents.append(parent)
                qs.append(q)
                level.append(len(tokens) - 1)
        frontier = [i for i in level if tokens[i] not in eos_ids]
        if d == len(shape) - 1 or not frontier:
            break
        dists = list(expand([tokens[i] for i in frontier], [fed.get(parents[i], ROOT) for i in frontier]))
        fed.update((i, len(fed)) for i in frontier)
    return tokens, parents, qs


def _children(probs: torch.Tensor, width: int, generator: torch.Generator | None,
              gumbel: torch.Tensor | None = None) -> list[tuple[int, torch.Tensor]]:
    """``width`` children and the distribution each was drawn from given the earlier ones."""
    support = int((probs > 0).sum())
    width = min(width, support)
    if gumbel is not None:  # coupled: Gumbel top-k with the position's own noise
        picked = torch.topk(coupled_scores(probs, gumbel), width).indices.tolist()
    elif generator is None:
        picked = torch.topk(probs, width).indices.tolist()
    else:  # Gumbel top-k = sequential sampling without replacement
        u = torch.rand(probs.shape, generator=generator, device=probs.device).clamp_(1e-20, 1.0)
        keys = torch.log(probs) - torch.log(-torch.log(u))
        picked = torch.topk(keys, width).indices.tolist()
    out = []
    q = probs
    for tok in picked:
        out.append((tok, q))
        q = q.clone()
        q[tok] = 0.0
        total = q.sum()
        q = q / total if total > 0 else q
    return out


def draft_chain(logits: torch.Tensor, advance: Callable[[int], torch.Tensor], max_len: int, ctx: DraftContext,
                stop: StopRule | None = None) -> Draft:
    """A chain drafted token by token from the drafter's logits after the context (V,).

    Greedy: the argmax; sampling: a draw from the warped distribution (kept as the token's q).
    ``advance(token)`` feeds the drafted token and returns the logits for the next position. A
    stopping rule judges the next position's distribution before it is drafted (never the first);
    drafting stops at EOS.
    """
    tokens: list[int] = []
    rows: list[torch.Tensor] = []
    if stop is not None:
        stop.start_draft()
    for step in range(max_len):
        if stop is not None and stop.should_stop(torch.softmax(logits, -1), step) and step > 0:
            break
        if ctx.sampling.greedy:
            token = int(logits.argmax())
        else:
            probs = warp(logits[None], ctx.sampling)[0]
            if ctx.noise is not None:  # coupled: the Gumbel-max with the noise the target's draw uses
                token = int(coupled_scores(probs, ctx.gumbel(step, probs.shape[-1])).argmax())
            else:
                token = int(torch.multinomial(probs, 1, generator=ctx.generator))
            rows.append(probs)
        tokens.append(token)
        if token in ctx.eos_ids or step == max_len - 1:
            break
        logits = advance(token)
    return Draft(tokens, torch.stack(rows) if rows else None)


def draft_tree(opts: TreeOptions, logits: torch.Tensor, expand_logits: Expand, max_len: int,
               ctx: DraftContext) -> Draft:
    """A draft tree of shape ``opts`` from the drafter's logits after the context (V,).

    ``expand_logits(tokens, parents)`` feeds tree nodes to the drafter and returns its logits
    after each (any drafter that can extend a pending tree: an LM's cache, a white-box head).
    """
    depth = min(opts.depth or max_len, max_len)
    root = _scores(logits, ctx.sampling)

    def expand(tokens: list[int], parents: list[int]) -> torch.Tensor:
        return _scores(expand_logits(tokens, parents), ctx.sampling)

    if opts.kind == "dynamic":
        tokens, parents = grow_dynamic(root, expand, opts.topk, opts.budget or DYNAMIC_BUDGET, depth, ctx.eos_ids)
        return Draft(tokens, None, parents)
    sampled = opts.kind == "sampled" and not ctx.sampling.greedy
    # under coupled sampling (a query with noise) every shaped tree draws with the coupled noise
    tokens, parents, qs = grow_shaped(root, expand, opts.shape[:depth], opts.budget or 1 << 30, ctx.eos_ids,
                                      ctx.generator if sampled else None,
                                      (lambda d: ctx.gumbel(d, root.shape[-1])) if ctx.noise is not None else None)
    if not sampled:
        return Draft(tokens, None, parents)
    return Draft(tokens, torch.stack(qs) if qs else None, parents)
