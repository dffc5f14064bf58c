"""Coupled sampling: the seed, not the drafts, decides every sampled token.

Each token is the Gumbel-max of the target's warped distribution, ``argmax_x log p_t(x) + g_t(x)``,
where the noise ``g_t`` is drawn from (seed, position t) alone. That is an exact draw from p_t (the
Gumbel-max trick), independent of every earlier position, so the text has the target's distribution;
and since the noise does not depend on what was drafted, verified or timed, one seed gives one text
whatever the drafters, the policy, the batch or the clock ("drafter-invariant speculative decoding",
Daliri, Musco and Suresh, 2024). A draft is then judged like a greedy one: accepted while it equals
the target's Gumbel-max. A drafter that drafts with the same noise (``argmax log q_t + g_t``) agrees
with the target with probability at least (1 − TV) / (1 + TV) (their bound), against 1 − TV for
classic rejection sampling; a lookup's point mass is accepted with p(x) under both.

The noise is drawn on the CPU with numpy's PCG64 seeded by (seed, position), so the same seed gives
the same noise on any device (the text may still differ where float rounding flips a near-tie).

Because the noise is known before the target runs, so is part of a point-mass draft's fate: a
lookup's token x̂ needs a high enough g_t(x̂) to win unless the target is nearly sure of it.
:class:`NoiseScreen` cuts lookup drafts before the tokens their own noise says will be rejected —
fewer tokens verified for nothing, the same text.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

import numpy as np
import torch


def gumbel_row(seed: int, position: int, width: int) -> torch.Tensor:
    """Standard Gumbel noise for one position, ``-log(-log u)`` with u uniform from (seed, position):
    float32 on the CPU (the precision of the scores it perturbs; ≈ 45 µs for 8k tokens).

    Prefix-stable (a wider row starts with the narrower one), so drafters whose vocabularies are
    padded to other widths see the same noise on the tokens they share.

    >>> bool(torch.equal(gumbel_row(3, 7, 5), gumbel_row(3, 7, 9)[:5]))
    True
    """
    u = torch.from_numpy(np.random.default_rng([seed, position]).random(width, dtype=np.float32))
    return u.clamp_(min=1e-30).log_().neg_().log_().neg_()


def coupled_scores(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """``log p + g`` (rows, V): its argmax per row is the coupled draw (tokens p excludes stay −inf)."""
    return probs.log() + noise


class PositionNoise:
    """One query's Gumbel noise per absolute position, on the model's device, kept while needed."""

    def __init__(self, seed: int, device: torch.device | str) -> None:
        self.seed = int(seed)
        self.device = torch.device(device)
        self._rows: dict[int, torch.Tensor] = {}
        self.width = 0  # the widest row asked for: a single token's noise is drawn that wide (reused)

    def row(self, position: int, width: int) -> torch.Tensor:
        """The noise at ``position`` over the first ``width`` token ids (float32, on the device)."""
        self.width = max(self.width, width)
        cached = self._rows.get(position)
        if cached is None or cached.numel() < width:
            cached = gumbel_row(self.seed, position, width).to(self.device)
            self._rows[position] = cached
        return cached[:width]

    def values(self, start: int, tokens: Sequence[int]) -> list[float]:
        """The noise of ``tokens[j]`` at position ``start + j``, for each j: one gather, one read back
        (the rows are drawn as wide as the verifier's and kept for it)."""
        width = max(self.width, max(tokens) + 1)
        rows = self.rows(range(start, start + len(tokens)), width)  # (len(tokens), width)
        return rows[torch.arange(len(tokens), device=rows.device), torch.tensor(tokens, device=rows.device)].tolist()

    def rows(self, positions: Sequence[int], width: int) -> torch.Tensor:
        """(len(positions), width): the noise at each position."""
        return torch.stack([self.row(p, width) for p in positions])

    def forget_before(self, position: int) -> None:
        """Positions before ``position`` are settled: their noise is never asked for again."""
        for p in [p for p in self._rows if p < position]:
            del self._rows[p]


# -- screening point-mass drafts by their own noise ---------------------------------------------------
NOISE_BINS = (-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.5)  # edges of the bins of a draft token's noise g_t(x̂)
SCREEN_MIN_PREFIX = 0.15  # a draft token must have this chance that it and all before it are accepted
SCREEN_PRIOR = 2.0  # pseudo-tokens per bin at the formula's value for p = ½
SCREEN_EXPLORE = 8  # every 8th draft the screen would cut runs whole: the cut bins keep being measured


def acceptance_given_noise(gamma: float, p: float = 0.5) -> float:
    """P(the Gumbel-max of the target picks x̂ | x̂'s own noise is γ) for a token of probability p.

    The other tokens' best perturbed score is a Gumbel located at log(1 − p), so x̂ wins with
    probability exp(−(1 − p)/p · e^{−γ}); averaged over γ it is p.

    >>> [round(acceptance_given_noise(g), 3) for g in (-1.0, 0.0, 2.0)]
    [0.066, 0.368, 0.873]
    """
    if p <= 0.0:
        return 0.0
    return math.exp(-(1.0 - p) / p * math.exp(-gamma))


def noise_bin(gamma: float) -> int:
    """The bin of a noise value among :data:`NOISE_BINS`.

    >>> [noise_bin(g) for g in (-3.0, -0.7, 0.2, 3.0)]
    [0, 1, 3, 7]
    """
    return bisect.bisect_right(NOISE_BINS, gamma)


class NoiseScreen:
    """Cuts a point-mass draft (a lookup's) under coupled sampling where it would be rejected.

    A draft token x̂ at position t is accepted iff it is the target's Gumbel-max there, and its own
    noise g_t(x̂) is known before the target runs: given it, the token wins with probability
    exp(−(1 − p)/p · e^{−γ}) (:func:`acceptance_given_noise`) — small for γ ≪ 0 unless the target
    is nearly sure of x̂, large for γ ≫ 0. The text does not change (the noise, not the draft,
    decides every token): only rejected tokens that were never worth verifying are saved.

    P(accept | γ's bin) is learned from judged tokens (a Beta posterior per bin, its prior the
    formula at p = ½, since the target's p is unknown before its forward); a draft is cut before
    its first token whose chance of being accepted together with every token before it falls
    below ``min_prefix``. Every ``explore``-th draft the screen would cut runs whole, so the bins it
    cuts keep being measured (a target that copies with p ≈ 1 accepts whatever the noise).

    >>> screen = NoiseScreen()
    >>> screen.cut([2.0, 1.0, -1.0, 3.0])  # 0.87, then × 0.69, then × 0.07: cut before the third
    2
    >>> for _ in range(50):
    ...     screen.observe([-1.0], accepted=1)  # this target accepts even at γ = −1
    >>> screen.cut([2.0, 1.0, -1.0, 3.0])
    4
    """

    def __init__(self, min_prefix: float = SCREEN_MIN_PREFIX, prior: float = SCREEN_PRIOR,
                 explore: int = SCREEN_EXPLORE) -> None:
        self.min_prefix, self.explore = min_prefix, explore
        mids = [NOISE_BINS[0] - 0.5, *((a + b) / 2 for a, b in itertools.pairwise(NOISE_BINS)), NOISE_BINS[-1] + 0.5]
        self.accepted = [prior * acceptance_given_noise(m) for m in mids]
        self.judged = [prior] * len(mids)
        self.cuts = 0  # drafts the screen would have cut (every explore-th is let through)

    def rate(self, gamma: float) -> float:
        b = noise_bin(gamma)
        return self.accepted[b] / self.judged[b]

    def cut(self, gammas: Sequence[float]) -> int:
        """How many of the draft's tokens to keep (their noises ``gammas``, in order)."""
        prefix = 1.0
        for kept, gamma in enumerate(gammas):
            prefix *= self.rate(gamma)
            if prefix < self.min_prefix:
                self.cuts += 1
                return len(gammas) if self.explore and self.cuts % self.explore == 0 else kept
        return len(gammas)

    def observe(self, gammas: Sequence[float], accepted: int) -> None:
        """A verified draft: its first ``accepted`` tokens were accepted and the next (if drafted) was not."""
        for j, gamma in enumerate(gammas[: accepted + 1]):
            b = noise_bin(gamma)
            self.judged[b] += 1.0
            self.accepted[b] += float(j < accepted)
