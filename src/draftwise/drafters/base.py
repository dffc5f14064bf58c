"""The drafter contract and its registry.

A drafter proposes draft tokens for a context; LM drafters also return their proposal
distribution per position (for lossless sampling and the 1 − TV acceptance probabilities),
deterministic drafters return ``probs=None`` (a point mass at each proposed token).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from draftwise.registry import Registry
from draftwise.verify import Sampling


@dataclass
class Draft:
    """A chain of draft tokens, or a tree when ``parents`` is given (:mod:`draftwise.tree`).

    In a tree, ``parents[i]`` is node i's parent (−1 = the context), nodes in topological order,
    and ``probs[i]`` the distribution node i was drawn from given its earlier siblings.
    """

    tokens: list[int]
    probs: torch.Tensor | None = None  # (len(tokens), V) warped proposal distribution; None = point mass
    parents: list[int] | None = None  # None = a chain

    @property
    def is_tree(self) -> bool:
        return self.parents is not None


@dataclass
class DraftContext:
    """What a drafter may use besides the token context: sampling settings and the query's RNG."""

    sampling: Sampling = field(default_factory=Sampling)
    generator: torch.Generator | None = None
    eos_ids: frozenset[int] = frozenset()


class Drafter(ABC):
    """Proposes draft tokens. Implementations keep whatever incremental state they need."""

    name: str = "drafter"
    point_mass: bool = True  # True when ``Draft.probs`` is always None
    reads_target_hidden: bool = False  # white-box: the engine hands it the target's hidden states

    def begin_query(self, prompt: Sequence[int]) -> None:
        """A new query starts with this prompt."""

    def end_query(self, tokens: Sequence[int], prompt_len: int) -> None:
        """The query finished with these tokens (prompt + response)."""

    def observe_target(self, tokens: Sequence[int], hidden: torch.Tensor, start: int) -> None:
        """The target's final hidden states at positions ``start, start + 1, …`` of the verified ``tokens``.

        Called by the engine after every round (and after the prompt's prefill) for drafters with
        ``reads_target_hidden``; ``hidden`` (k, H) row j is the state after reading
        ``tokens[start + j]``, i.e. the input of the target's LM head that predicted the next
        token. Rows from ``start`` on replace any the drafter kept. Together they cover every
        position but the last, whose token (the target's own) has not been through the target yet.
        """

    @abstractmethod
    def propose(self, context: Sequence[int], max_len: int, ctx: DraftContext, stop: Any = None) -> Draft:
        """Up to ``max_len`` draft tokens continuing ``context`` (the verified tokens).

        ``stop`` is a dynamic stopping rule (:mod:`draftwise.drafters.stopping`); drafters
        without a distribution to judge ignore it.
        """

    def first_tokens_along(self, context: Sequence[int], verified: Sequence[int], ctx: DraftContext) -> list[int | None]:
        """What this (deterministic) drafter would have proposed first at each verified position:
        after ``context``, after ``context + verified[:1]``, … (the evaluation phase's counterfactual).
        Its state moves forward over ``verified`` as it would by drafting there."""
        out: list[int | None] = []
        sequence = list(context)  # grown one token at a time: no copy of the context per position
        for token in verified:
            proposal = self.propose(sequence, 1, ctx).tokens
            out.append(proposal[0] if proposal else None)
            sequence.append(token)
        return out

    def describe(self) -> dict[str, Any]:
        """Name, kind and options, for result files."""
        return {"name": self.name, "kind": type(self).__name__}


DrafterFactory = Callable[..., Drafter]
DRAFTERS: Registry[DrafterFactory] = Registry("drafter kind")
