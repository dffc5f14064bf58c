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

The noise is a hash, not a generator's stream: token x's uniform at position t is a 32-bit
integer hash of (x, keys of (seed, t)), computed where the scores are — on a GPU, every row of a
batched round in a few kernels, where a generator per (seed, position) drew each row on the CPU and
copied it over (≈ 0.1 ms a row: more than a plain batched step at 32 rows). Integer arithmetic gives
the same bits on any device, so the same seed gives the same noise everywhere (the text may still
differ where float rounding flips a near-tie).

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
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from draftwise.verify.chain import Sampling, warp

MASK32 = 0xFFFFFFFF
MASK64 = (1 << 64) - 1
# lowbias32_r from Wellons' hash prospector (shift, multiply, shift, multiply, shift): a bijection of
# 32-bit integers with very low bias; both multipliers < 2^31, so int64 products never overflow
MIX_MULTIPLIERS = (0x21F0AAAD, 0x735A2D97)
UNIFORM_BITS = 23  # u = (h >> 9 + ½) / 2^23: exact in float32, in [2^-24, 1 − 2^-24]


def noise_keys(seed: int, position: int) -> tuple[int, int]:
    """Two 32-bit keys of one position's noise: splitmix64's finalizer over (seed, position).

    >>> noise_keys(3, 7) != noise_keys(3, 8) != noise_keys(4, 7)
    True
    """
    z = (seed * 0x9E3779B97F4A7C15 + position * 0xD1B54A32D192ED03 + 0x632BE59BD9B4E019) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    z ^= z >> 31
    return z & MASK32, z >> 32


def _mix(x: Any) -> Any:
    """lowbias32_r on a Python int or an int64 tensor holding 32-bit values."""
    a, b = MIX_MULTIPLIERS
    x = x ^ (x >> 16)
    x = (x * a) & MASK32
    x = x ^ (x >> 15)
    x = (x * b) & MASK32
    return x ^ (x >> 15)


def _mix_numpy(x: np.ndarray) -> None:
    """The same in place on uint32 arrays (their products wrap mod 2^32): on a CPU 7× faster for a
    batch's rows than int64 temporaries."""
    a, b = (np.uint32(m) for m in MIX_MULTIPLIERS)
    x ^= x >> np.uint32(16)
    x *= a
    x ^= x >> np.uint32(15)
    x *= b
    x ^= x >> np.uint32(15)


def uniforms(keys: Sequence[tuple[int, int]], width: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(len(keys), width) uniforms from the hashes h(x) = mix(mix(x ⊕ k₁) ⊕ k₂), float32 on ``device``.
    Each row's h is a bijection of the token ids, and every step is exact, so a CPU (numpy: fewer,
    cheaper calls) and a GPU (torch) give the same bits."""
    device = torch.device(device)
    if device.type != "cpu":
        return uniforms_torch(keys, width, device)
    k1, k2 = (np.array(k, dtype=np.uint32)[:, None] for k in zip(*keys))
    x = np.arange(width, dtype=np.uint32)[None, :] ^ k1
    _mix_numpy(x)
    x ^= k2
    _mix_numpy(x)
    u = (x >> np.uint32(32 - UNIFORM_BITS)).astype(np.float32)
    u += np.float32(0.5)
    u *= np.float32(2.0 ** -UNIFORM_BITS)
    return torch.from_numpy(u)


def uniforms_torch(keys: Sequence[tuple[int, int]], width: int, device: torch.device) -> torch.Tensor:
    """:func:`uniforms` in torch operations on ``device`` (a batch's rows in a few kernels)."""
    t1, t2 = (torch.tensor(k, dtype=torch.int64, device=device)[:, None] for k in zip(*keys))
    y = _mix(_mix(torch.arange(width, dtype=torch.int64, device=device)[None, :] ^ t1) ^ t2)
    return ((y >> (32 - UNIFORM_BITS)).float() + 0.5) * 2.0 ** -UNIFORM_BITS


def gumbel_rows(keys: Sequence[tuple[int, int]], width: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Standard Gumbel noise ``-log(-log u)``, one row per position's keys (:func:`noise_keys`),
    float32 (the precision of the scores it perturbs) on ``device``."""
    return uniforms(keys, width, device).log_().neg_().log_().neg_()


def gumbel_value(seed: int, position: int, token: int) -> float:
    """One token's noise from Python integers (for a few tokens: no tensor at all).

    >>> abs(gumbel_value(3, 7, 4) - float(gumbel_row(3, 7, 5)[4])) < 1e-5
    True
    """
    k1, k2 = noise_keys(seed, position)
    u = ((_mix(_mix(token ^ k1) ^ k2) >> (32 - UNIFORM_BITS)) + 0.5) * 2.0 ** -UNIFORM_BITS
    return -math.log(-math.log(u))


def gumbel_row(seed: int, position: int, width: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The noise of one position: its token x's value depends on (seed, position, x) alone.

    Prefix-stable (a wider row starts with the narrower one), so drafters whose vocabularies are
    padded to other widths see the same noise on the tokens they share.

    >>> bool(torch.equal(gumbel_row(3, 7, 5), gumbel_row(3, 7, 9)[:5]))
    True
    """
    return gumbel_rows([noise_keys(seed, position)], width, device)[0]


def coupled_scores(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """``log p + g`` (rows, V): its argmax per row is the coupled draw (tokens p excludes stay −inf)."""
    return probs.log() + noise


class PositionNoise:
    """One query's Gumbel noise per absolute position, on the model's device, kept while needed."""

    def __init__(self, seed: int, device: torch.device | str) -> None:
        self.seed = int(seed)
        self.device = torch.device(device)
        self._rows: dict[int, torch.Tensor] = {}

    def row(self, position: int, width: int) -> torch.Tensor:
        """The noise at ``position`` over the first ``width`` token ids (float32, on the device)."""
        cached = self._rows.get(position)
        if cached is None or cached.numel() < width:
            cached = gumbel_row(self.seed, position, width, self.device)
            self._rows[position] = cached
        return cached[:width]

    def values(self, start: int, tokens: Sequence[int]) -> list[float]:
        """The noise of ``tokens[j]`` at position ``start + j``, for each j, in double precision
        (the rows are float32: a screen's bins do not need their last bits). The hash makes each
        value a few integer operations — no row drawn, nothing sent to or read from a device."""
        return [gumbel_value(self.seed, start + j, token) for j, token in enumerate(tokens)]

    def rows(self, positions: Sequence[int], width: int) -> torch.Tensor:
        """(len(positions), width): the noise at each position (those not drawn yet, in one go)."""
        return noise_rows([(self, positions)], width)

    def forget_before(self, position: int) -> None:
        """Positions before ``position`` are settled: their noise is never asked for again."""
        for p in [p for p in self._rows if p < position]:
            del self._rows[p]

    def missing(self, positions: Sequence[int], width: int) -> list[int]:
        """The positions whose noise is not yet drawn ``width`` wide."""
        return [p for p in positions if p not in self._rows or self._rows[p].numel() < width]

    def keep(self, position: int, row: torch.Tensor) -> None:
        """Keep a row drawn elsewhere (:func:`noise_rows` draws a batch's rows together)."""
        self._rows[position] = row


def noise_rows(requests: Sequence[tuple[PositionNoise, Sequence[int]]], width: int) -> torch.Tensor:
    """Every request's noise rows (its positions in order), stacked: (Σ positions, ``width``) on the
    noises' device (one batch's queries share it). The rows not drawn yet are drawn together."""
    todo = [(noise, p) for noise, positions in requests for p in noise.missing(positions, width)]
    if todo:
        block = gumbel_rows([noise_keys(noise.seed, p) for noise, p in todo], width, requests[0][0].device)
        for (noise, p), row in zip(todo, block):
            noise.keep(p, row)
    return torch.stack([noise.row(p, width) for noise, positions in requests for p in positions])


@dataclass(frozen=True)
class CoupledDraw:
    """What the target's coupled draws decided for one query's chain draft of n tokens."""

    choices: list[int]  # the target's draw at each of the n + 1 positions
    accept_probs: list[float]  # p(x̂_j) for each draft token (the learners' divergence signal)
    probs: torch.Tensor  # (n + 1, V) the warped target


@dataclass(frozen=True)
class DrawJob:
    """One query's rows of a batched forward, to be drawn with its noise (a point-mass chain draft)."""

    noise: PositionNoise
    start: int  # the position the first row's token takes (the context's length)
    draft: Sequence[int]
    logits: torch.Tensor  # (n + 1, V)
    sampling: Sampling


def coupled_draws(jobs: Sequence[DrawJob]) -> list[CoupledDraw]:
    """The target's coupled draws for many queries at once: the same tokens as drawing each query
    alone (``argmax log p + g`` per row), with one warp per sampling setting, one argmax and one
    read back for the whole batch instead of several small operations a query — on a GPU each is a
    kernel launch or a wait, which cost a sampled batch more than its forward."""
    sizes = [len(job.draft) + 1 for job in jobs]
    groups: dict[Sampling, list[int]] = {}
    for i, job in enumerate(jobs):
        groups.setdefault(job.sampling, []).append(i)
    parts: list[torch.Tensor] = [torch.empty(0)] * len(jobs)
    for sampling, members in groups.items():
        warped = warp(torch.cat([jobs[i].logits for i in members]), sampling)
        for i, chunk in zip(members, warped.split([sizes[i] for i in members])):
            parts[i] = chunk
    probs = torch.cat(parts)
    width = probs.shape[-1]
    noise = noise_rows([(job.noise, range(job.start, job.start + n)) for job, n in zip(jobs, sizes)], width)
    choices = coupled_scores(probs, noise).max(-1).indices.tolist()  # max's index = argmax (first maximum)
    starts = list(itertools.accumulate(sizes, initial=0))
    rows = [starts[i] + j for i, job in enumerate(jobs) for j in range(len(job.draft))]
    tokens = [t for job in jobs for t in job.draft]
    accept = probs[torch.tensor(rows, device=probs.device), torch.tensor(tokens, device=probs.device)].tolist() \
        if tokens else []
    out = []
    for i, job in enumerate(jobs):
        lo, n = starts[i], len(job.draft)
        first = starts[i] - i  # draft tokens before this job's
        out.append(CoupledDraw(choices[lo : lo + n + 1], accept[first : first + n], parts[i]))
    return out


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
