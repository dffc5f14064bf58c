"""The drafter contract and its registry.

Every drafter proposes draft tokens for a context and can say how it would have fared along
tokens the target verified (the routing signal and the evaluation phase's counterfactual
feedback). Two families implement that contract:

* :class:`Drafter` itself covers deterministic drafters (prompt lookup, suffix, retrieval): a
  point mass at each proposed token (``probs=None``), scored by what they would have proposed.
* :class:`ModelDrafter` covers drafters with a next-token distribution (LM drafters, alone or on a
  batched bank, and white-box heads): scored by their logits, batched through a bank when they
  share one, optionally reading the target's hidden states.

The engine only calls the methods declared here; it never asks which kind of drafter it holds.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from draftwise.drafters.draft_shapes import TreeOptions, counterfactual_acceptance
from draftwise.registry import Registry
from draftwise.verify.chain import Sampling, top1_hits
from draftwise.verify.draft import Draft, DraftContext

if TYPE_CHECKING:
    from typing import Self

__all__ = ["DRAFTERS", "Draft", "DraftContext", "Drafter", "DrafterBank", "ModelDrafter", "SharedForwards"]


class SharedForwards(dict[tuple[str, int | str], Any]):
    """Forwards that several drafters share within one scoring pass (routing, one evaluation phase):
    drafters on one bank keep their batched result here, keyed by the bank, so it runs once."""


class Drafter(ABC):
    """Proposes draft tokens. Implementations keep whatever incremental state they need.

    The base class is a deterministic (point-mass) drafter's contract; a drafter with a
    distribution derives from :class:`ModelDrafter`.
    """

    name: str = "drafter"
    # White-box: the engine hands it the target's hidden states (:meth:`observe_target`) of these
    # layers (transformers' indices: −1 is the final one, the LM head's input), side by side
    reads_target_hidden: bool = False
    feature_layers: tuple[int, ...] = (-1,)

    def begin_query(self, prompt: Sequence[int]) -> None:
        """A new query starts with this prompt."""

    def end_query(self, tokens: Sequence[int], prompt_len: int) -> None:
        """The query finished with these tokens (prompt + response)."""

    def recover(self) -> None:
        """A query was interrupted, perhaps inside one of this drafter's updates: drop whatever
        per-query state (caches, indexes) an interrupted update may have left half-done. What it
        learned across queries may stay; the next query rebuilds the rest."""

    def observe_target(self, tokens: Sequence[int], hidden: torch.Tensor, start: int) -> None:
        """The target's hidden states at positions ``start, start + 1, …`` of the verified ``tokens``.

        Called by the engine after every round (and after the prompt's prefill) for drafters with
        ``reads_target_hidden``; ``hidden`` (k, len(feature_layers) × H) row j is the states after reading
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

    def fresh(self) -> Self:
        """A copy with no query state, sharing read-only weights and stores (one per benchmark
        method, or per query of a batch)."""
        return copy.deepcopy(self)

    # -- how it would have fared along verified tokens (routing and the evaluation phase) ----------
    def first_tokens_along(self, context: Sequence[int], verified: Sequence[int],
                           ctx: DraftContext) -> list[int | None]:
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

    def prompt_fit(self, prompt: Sequence[int], window: int, lookback: int, ctx: DraftContext,
                   shared: SharedForwards) -> float:
        """Top-1 accuracy on the prompt's last ``window`` tokens: how well this drafter predicts the
        prompt itself (the routing signal). A lookup replays the whole prompt (its state only grows)."""
        cut = len(prompt) - window
        guesses = self.first_tokens_along(prompt[:cut], prompt[cut:], ctx)
        return sum(g == t for g, t in zip(guesses, prompt[cut:])) / window

    def note_verified(self, context: Sequence[int], verified: Sequence[int], ctx: DraftContext) -> Any:
        """Called as each round's tokens are verified, before :meth:`acceptance_along` scores them
        (perhaps rounds later). A deterministic drafter answers now, while its state has seen
        exactly this prefix: its first proposal at each verified position."""
        return self.first_tokens_along(context, verified, ctx)

    def acceptance_along(self, prefix: Sequence[int], notes: Sequence[Any], choice: Sequence[int],
                         target_probs: torch.Tensor | None, sampling: Sampling, shared: SharedForwards) -> list[float]:
        """This drafter's acceptance probability at each verified position of pending rounds.

        ``notes``: what :meth:`note_verified` returned for each round, in order; ``choice`` the
        target's argmax at every verified position; ``target_probs`` (T, V) its warped
        distribution there (None under greedy); ``prefix`` the context up to the last position.
        A point mass is accepted with the target's probability of its token (1[token = argmax] greedy).
        """
        proposed = [token for note in notes for token in note]
        if target_probs is None:
            return [float(token == best) for token, best in zip(proposed, choice)]
        index = torch.tensor([-1 if t is None else t for t in proposed], device=target_probs.device)
        mass = target_probs[torch.arange(len(proposed), device=target_probs.device), index].tolist()
        return [0.0 if token is None else m for token, m in zip(proposed, mass)]

    def describe(self) -> dict[str, Any]:
        """Name, kind and options, for result files."""
        return {"name": self.name, "kind": type(self).__name__}


class DrafterBank(Protocol):
    """Several model drafters of one shape run as one batch (:class:`draftwise.models.drafter_bank.LlamaBank`)."""

    def sync_all(self, tokens: Sequence[int], n_out: int) -> torch.Tensor:
        """Every member's logits (members, n_out, V) after each of the last ``n_out`` positions."""
        ...

    def top1_all(self, tokens: Sequence[int], targets: Sequence[int]) -> torch.Tensor:
        """Whether each member's top-1 is the target token, (members, len(targets)) bool."""
        ...


class ModelDrafter(Drafter):
    """A drafter with a next-token distribution: LM drafters and white-box heads.

    What the engine uses beyond :class:`Drafter`: :meth:`next_logits` (its distribution along a
    context), the acceptance that follows from it along verified tokens (chain or tree,
    :func:`~draftwise.drafters.draft_shapes.counterfactual_acceptance`), batching through a
    ``bank`` it shares with drafters of its shape, and stopping rules judging its chains. A
    white-box head also sets ``reads_target_hidden``.
    """

    tree: TreeOptions
    bank: DrafterBank | None = None  # set when it runs on a shared batched bank
    bank_slot: int = 0  # its row in the bank's batched results
    reads_prompt_tail: bool = False  # routing may score it on the prompt's tail only (its cache follows any context)
    # the domains it was trained (distilled) on, where known (the zoo's): a drafter trained on every
    # domain of the others in a pool needs no routing among them (draftwise.decision.arms.generalist_of)
    domains: tuple[str, ...] = ()

    @abstractmethod
    def next_logits(self, context: Sequence[int], n_out: int) -> torch.Tensor:
        """Float32 logits (n_out, V) after each of the last ``n_out`` positions of ``context``."""

    def hf_model(self) -> Any | None:
        """The Hugging Face causal LM behind it, if any: a batched bank may run it, and transformers'
        assisted generation can use it as a peer's assistant."""
        return None

    def join_bank(self, bank: Any, slot: int) -> None:
        """Run on ``bank`` from now on, as its member ``slot``."""
        raise NotImplementedError(f"{type(self).__name__} does not run on a drafter bank")

    def shared_logits(self, prefix: Sequence[int], n_out: int, shared: SharedForwards) -> torch.Tensor:
        """:meth:`next_logits`, or — on a bank — its row of one batched forward of every member."""
        if self.bank is None:
            return self.next_logits(prefix, n_out)
        key = ("logits", id(self.bank))
        if key not in shared:
            shared[key] = self.bank.sync_all(prefix, n_out)  # (members, n_out, V)
        return shared[key][self.bank_slot]

    def prompt_fit(self, prompt: Sequence[int], window: int, lookback: int, ctx: DraftContext,
                   shared: SharedForwards) -> float:
        """Top-1 accuracy on the prompt's last ``window`` tokens from its logits, no target call.
        An LM drafter reads ``lookback`` tokens before the window only; a bank scores every
        member in one batched forward."""
        targets = list(prompt[len(prompt) - window :])
        seen = prompt[-(window + lookback + 1) :] if self.reads_prompt_tail else prompt
        if self.bank is not None:
            key = ("top1", id(self.bank))
            if key not in shared:
                shared[key] = self.bank.top1_all(list(seen[:-1]), targets)
            hits = shared[key][self.bank_slot]
        else:
            logits = self.next_logits(list(seen[:-1]), window)
            hits = top1_hits(logits, torch.tensor(targets, device=logits.device))
        return float(hits.float().mean())

    def note_verified(self, context: Sequence[int], verified: Sequence[int], ctx: DraftContext) -> Any:
        return None  # scored later from its logits, which its cache can compute at any time

    def acceptance_along(self, prefix: Sequence[int], notes: Sequence[Any], choice: Sequence[int],
                         target_probs: torch.Tensor | None, sampling: Sampling, shared: SharedForwards) -> list[float]:
        """Chain (width 1): greedy 1[argmax q = argmax p], sampling 1 − TV(p, q); a tree's first
        level as point masses (see :func:`~draftwise.drafters.draft_shapes.counterfactual_acceptance`).
        One short forward over all pending positions."""
        q_logits = self.shared_logits(prefix, len(choice), shared)  # (T, V)
        key = ("choice", str(q_logits.device))
        if key not in shared:  # the target's argmax as a tensor, made once per phase
            shared[key] = torch.tensor(list(choice), device=q_logits.device)
        return counterfactual_acceptance(q_logits, shared[key], target_probs, sampling, self.tree.first_width,
                                         point_mass=self.tree.kind != "chain")


DrafterFactory = Callable[..., Drafter]
DRAFTERS: Registry[DrafterFactory] = Registry("drafter kind")
