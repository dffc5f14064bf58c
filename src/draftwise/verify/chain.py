"""Verification of a draft against the target in one forward pass: pure tensor functions.

Shapes: a draft of n tokens; the target's logits or probabilities have n + 1 rows (one per draft
position plus the bonus position after the last draft token); proposal probabilities have n rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# A temperature below this is run as greedy decoding (vLLM's threshold too): at such temperatures every
# draw is the argmax already, and below ≈ 1e-37 ``logits / temperature`` overflows float32 into NaN.
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen: greedy when temperature is 0, else warped sampling.

    ``coupled``: each sampled token is the Gumbel-max of the warped target with noise fixed by the
    query's seed and the token's position (:mod:`draftwise.verify.coupling`: one seed, one text, whatever
    was drafted); else classic speculative (rejection) sampling, whose draws depend on the drafts.
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    coupled: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sampling_settings(temperature: float, top_k: int | None = None, top_p: float | None = None) -> Sampling:
    """The :class:`Sampling` that checked settings ask for: greedy (exactly the target's argmax path) when
    ``temperature`` is below :data:`GREEDY_BELOW`; ``top_p`` 1 is no nucleus.

    >>> sampling_settings(1e-300, top_p=0.5) == Sampling()
    True
    >>> sampling_settings(0.7, top_k=4, top_p=1.0)
    Sampling(temperature=0.7, top_k=4, top_p=None, coupled=False)
    """
    if temperature < GREEDY_BELOW:
        return Sampling()
    return Sampling(temperature=float(temperature), top_k=top_k, top_p=None if top_p is None or top_p >= 1 else top_p)


@dataclass(frozen=True)
class Verdict:
    accepted: int  # draft tokens accepted
    next_token: int  # the target's correction (after a rejection) or bonus token (all accepted)
    accept_probs: list[float]  # per draft position: probability the drafter's token is accepted


def warp(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) on logits (n, V) → probabilities (n, V).

    The same warp is applied to target and drafter so the accepted tokens follow the warped target.
    """
    scores = logits / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < scores.shape[-1]:
        kth = torch.topk(scores, sampling.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if sampling.top_p is not None and sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # drop a token when the mass strictly before it already reaches top_p; the top token always stays
        # (a top_p below float32's smallest value rounds to 0, which the top token's 0 would reach)
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= sampling.top_p
        drop_sorted[..., 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def top1_hits(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Whether each row's top-1 is its target token: ``logits[..., target] >= max`` (bool, logits.shape[:-1]).

    Same as ``argmax(-1) == targets`` up to exact ties, and ≈ 10× faster on CPU over a vocabulary
    (a max reduction vectorizes; an argmax does not): routing scores 7 drafters × 48 positions.

    >>> top1_hits(torch.tensor([[0.1, 2.0, 0.3], [1.0, 0.0, 0.5]]), torch.tensor([1, 2])).tolist()
    [True, False]
    """
    return logits.gather(-1, targets[..., None]).squeeze(-1) >= logits.amax(-1)


def verify_greedy(draft: Sequence[int], target_logits: torch.Tensor, choice: Sequence[int] | None = None) -> Verdict:
    """Accept the longest prefix equal to the target's argmax, then the target's next argmax.

    Coupled sampling judges the same way on the perturbed scores ``log p + g`` (their argmax is the
    target's draw; :func:`draftwise.verify.coupling.coupled_scores`).

    ``max(-1).indices`` is argmax's answer (the first maximal index) at ≈ 0.6× its cost on CPU
    (50 vs 80 µs for 5 rows of 8k logits, per query and round: a batch's bookkeeping). ``choice``:
    that argmax per row when already computed (a batch computes every row's at once)."""
    if choice is None:
        choice = target_logits.max(-1).indices.tolist()  # (n + 1,)
    if not draft:  # a plain round (most rows of a loaded batch)
        return Verdict(0, choice[0], [])
    matches = [float(d == c) for d, c in zip(draft, choice)]
    accepted = matches.index(0.0) if 0.0 in matches else len(draft)
    return Verdict(accepted, choice[accepted], matches)


def acceptance_probs(draft: Sequence[int], p: torch.Tensor, q: torch.Tensor | None) -> torch.Tensor:
    """Per-position probability of accepting the drafter's token.

    LM drafter: Σ_x min(p, q) = 1 − TV(p, q). Point-mass drafter (q = one-hot at x̂): p(x̂).
    """
    n = len(draft)
    if q is None:
        return p[torch.arange(n), torch.tensor(draft, dtype=torch.long, device=p.device)]
    return torch.minimum(p[:n], q).sum(-1)


def verify_sampling(
    draft: Sequence[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> Verdict:
    """Speculative sampling (Leviathan et al. / Chen et al.): lossless for any proposal q.

    Accept x̂_j with probability min(1, p(x̂_j) / q(x̂_j)); on the first rejection sample from
    norm(max(0, p − q)); if every token is accepted sample a bonus token from p. ``draft_probs``
    None means a point-mass drafter (q = one-hot at x̂): acceptance p(x̂), residual p without x̂.
    """
    n = len(draft)
    device = target_probs.device
    index = torch.tensor(list(draft), dtype=torch.long, device=device)
    rows = torch.arange(n, device=device)
    p_tok = target_probs[rows, index]
    q_tok = torch.ones_like(p_tok) if draft_probs is None else draft_probs[rows, index]
    ratio = (p_tok / q_tok).clamp(max=1.0)
    u = torch.rand(n, generator=generator, device=device)
    rejected = (u >= ratio).nonzero()
    accepted = int(rejected[0, 0]) if len(rejected) else n
    accept_probs = acceptance_probs(draft, target_probs, draft_probs).tolist()
    if accepted == n:
        bonus = torch.multinomial(target_probs[n], 1, generator=generator)
        return Verdict(n, int(bonus), accept_probs)
    p = target_probs[accepted]
    if draft_probs is None:
        residual = p.clone()
        residual[draft[accepted]] = 0.0
    else:
        residual = (p - draft_probs[accepted]).clamp(min=0.0)
    total = residual.sum()
    # p == q exactly leaves no residual mass; then the rejection had probability 0 (guard only)
    residual = residual / total if total > 0 else p
    correction = torch.multinomial(residual, 1, generator=generator)
    return Verdict(accepted, int(correction), accept_probs)
