"""A draft — a chain of tokens or a tree — and what a drafter may use besides the token context."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from draftwise.verify.chain import Sampling
from draftwise.verify.coupling import PositionNoise


@dataclass
class Draft:
    """A chain of draft tokens, or a tree when ``parents`` is given (:mod:`draftwise.verify.tree`).

    In a tree, ``parents[i]`` is node i's parent (−1 = the context), nodes in topological order,
    and ``probs[i]`` the distribution node i was drawn from given its earlier siblings.
    """

    tokens: list[int]
    probs: torch.Tensor | None = None  # (len(tokens), V) warped proposal distribution; None = point mass
    parents: list[int] | None = None  # None = a chain
    match: int = 0  # a lookup's: how many of the context's last tokens it matched (0: not a lookup's)



@dataclass
class DraftContext:
    """What a drafter may use besides the token context: sampling settings and the query's RNG.

    Under coupled sampling, ``noise`` holds the query's per-position Gumbel noise and ``position``
    the index the round's first draft token would take (the engine sets it before drafting): a
    drafter draws token j with the noise at ``position + j``, the noise the target's draw uses.
    """

    sampling: Sampling = field(default_factory=Sampling)
    generator: torch.Generator | None = None
    eos_ids: frozenset[int] = frozenset()
    noise: PositionNoise | None = None
    position: int = 0

    def gumbel(self, step: int, width: int) -> torch.Tensor:
        """The coupled noise for draft position ``step`` of this round (coupled sampling only)."""
        assert self.noise is not None, "coupled sampling gives every query its noise"
        return self.noise.row(self.position + step, width)
