"""Priced drafts: how much of a lookup's draft to verify, from its tokens' predicted acceptance and
what verifying them costs on this machine (pure maths; the engine supplies both).

A lookup's draft is known before its round: its length and where it came from. Whether its k-th
token will be accepted, given the ones before it were, is predicted from what is known then
(:class:`DraftAcceptance`: by the arm, by how much the lookup proposed and how long a stretch of the
context it matched — a long match is mostly accepted whole, a short one is a guess — and by whether
the answer is still in its opening), and the
draft is cut to the length with the most expected tokens per second (:func:`priced_length`):

    L* = argmax over L of (1 + Σ_{k ≤ L} Π_{j ≤ k} p_j) / cost(L + 1)

``cost(n)`` being a round verifying n tokens, in plain rounds. A CPU's curve is not smooth (the
4-bit kernel works on rows in fours: a fifth token costs 0.35–0.41 of a plain step on one machine,
a second token almost nothing), so the answer is read off the curve, never from a slope.

The predictions are learned online from every verified draft and kept across queries. A draft cut
at L says nothing of its later tokens, so a position seen rarely is judged optimistically (half a
standard deviation above its mean): the cut then lets longer drafts through until it knows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence

from draftwise.decision.step_costs import load_bucket

LONGEST = 16  # positions tracked; later ones share the last one's estimate
OPENING = 16  # answer tokens whose rounds are judged apart: lookups rarely match there
PRIOR = 0.7  # a draft token's acceptance before any is seen, worth PRIOR_WEIGHT verdicts
PRIOR_WEIGHT = 2.0
OPTIMISM = 0.5  # standard deviations above the mean a position is judged at (see the module docstring)
FADE = 0.998  # per verdict of a key: the estimate follows a query mix that drifts
ROUND_WEIGHT = 0.05  # a measured round's weight in its length's price correction
MIN_GAIN = 1.02  # a draft must promise this over a plain round: the curve and the predictions are estimates

Key = tuple[Hashable, ...]


def bucket(n: int) -> int:
    """Counts (tokens proposed, tokens matched) in the buckets acceptance is kept by: 0, 1, 2, 3, 4–7, 8+.

    >>> [bucket(n) for n in (0, 1, 2, 3, 4, 7, 8, 24)]
    [0, 1, 2, 3, 4, 4, 8, 8]
    """
    return n if n < 4 else 4 if n < 8 else 8


def draft_key(arm: int, proposed: int, matched: int, position: int, greedy: bool) -> Key:
    """What a draft's acceptance is predicted by: its arm, how much it proposed and how many of the
    context's last tokens its lookup matched (bucketed: a suffix match of 8 tokens or more was
    accepted nearly whole, a one-token match 22 % of the time on the dev split), whether the answer
    is in its opening and whether the query is greedy (a sampled token matches less often)."""
    return arm, bucket(proposed), bucket(matched), position < OPENING, greedy


class DraftAcceptance:
    """P(the k-th draft token is accepted | the k − 1 before it were), per key and position, from
    fading counts of verified drafts, kept across queries (one per target: the engine's)."""

    def __init__(self, prior: float = PRIOR, weight: float = PRIOR_WEIGHT, fade: float = FADE) -> None:
        self.prior, self.weight, self.fade = prior, weight, fade
        self.tried: dict[Key, list[float]] = {}  # position k − 1 → verdicts that reached it
        self.kept: dict[Key, list[float]] = {}  # … and were accepted

    def _counts(self, key: Key) -> tuple[list[float], list[float]]:
        if key not in self.tried:
            self.tried[key] = [self.weight] * LONGEST
            self.kept[key] = [self.weight * self.prior] * LONGEST
        return self.tried[key], self.kept[key]

    def survival(self, key: Key, length: int, optimism: float = OPTIMISM) -> list[float]:
        """The optimistic conditional acceptance of positions 1..``length``: the mean plus
        ``optimism`` standard deviations of its estimate (at most 1).

        >>> book = DraftAcceptance()
        >>> [round(p, 3) for p in book.survival(("a",), 2)]
        [0.862, 0.862]
        >>> for _ in range(50):
        ...     book.observe(("a",), drafted=2, accepted=0)
        >>> [round(p, 3) for p in book.survival(("a",), 2)]  # the first token learned; the second barely seen
        [0.037, 0.862]
        """
        tried, kept = self._counts(key)
        out = []
        for k in range(length):
            n, s = tried[min(k, LONGEST - 1)], kept[min(k, LONGEST - 1)]
            mean = s / n
            out.append(min(1.0, mean + optimism * math.sqrt(mean * (1 - mean) / n)))
        return out

    def observe(self, key: Key, drafted: int, accepted: int) -> None:
        """One verified draft of ``drafted`` tokens of which the first ``accepted`` were accepted."""
        tried, kept = self._counts(key)
        reached = min(drafted, accepted + 1)
        for k in range(min(reached, LONGEST)):
            tried[k] = self.fade * tried[k] + 1.0
            kept[k] = self.fade * kept[k] + (k < accepted)


class RoundPrices:
    """What a whole round verifying a lookup's d tokens costs — the forward, verification, drafting
    and bookkeeping — from the machine's forward curve (``forward_s``: seconds of a forward over n
    new tokens) times a correction per d, fitted to the rounds measured (a running mean of their
    ratio to the curve; a length not yet measured takes the nearest measured one's). A drafted round
    costs more than its forward: on one machine 1.06× a plain round by the curve but 1.13× measured
    for one drafted token, and 2.08× against 2.42× for eight."""

    def __init__(self, forward_s: Callable[[int], float], weight: float = ROUND_WEIGHT,
                 longest: int = LONGEST) -> None:
        self.forward_s, self.weight, self.longest = forward_s, weight, longest
        self.scale: dict[int, float] = {}

    def seconds(self, drafted: int) -> float:
        """A round drafting ``drafted`` tokens."""
        d = min(drafted, self.longest)
        scale = self.scale.get(d)  # measured: most asks, every round (no search of the others)
        if scale is None:
            known = min(self.scale, key=lambda n: (abs(n - d), n), default=None)
            scale = self.scale[known] if known is not None else 1.0
        return self.forward_s(drafted + 1) * scale

    def cost(self, tokens: int) -> float:
        """A round verifying ``tokens`` tokens (``tokens − 1`` drafted) in plain rounds.

        >>> prices = RoundPrices(lambda n: 0.010 + 0.001 * (n - 1))
        >>> prices.observe(0, 0.010); prices.observe(4, 0.0175)
        >>> round(prices.cost(5), 3), round(prices.cost(4), 3)  # 3 drafted: not measured, priced as 4
        (1.75, 1.625)
        """
        return self.seconds(tokens - 1) / self.seconds(0)

    def observe(self, drafted: int, seconds: float) -> None:
        """One measured round (a round far off its price is a stall, not a cost, and is left out)."""
        d = min(drafted, self.longest)
        ratio = seconds / self.forward_s(drafted + 1)
        old = self.scale.get(d)
        if old is None:
            if 1 / 4 < ratio < 4:
                self.scale[d] = ratio
        elif 1 / 4 < ratio / old < 4:
            self.scale[d] = old + self.weight * (ratio - old)


def expected_tokens(survival: Sequence[float], length: int) -> float:
    """Tokens a round emits on average when it verifies the first ``length`` draft tokens:
    1 + Σ_{k ≤ length} Π_{j ≤ k} p_j.

    >>> expected_tokens([0.5, 0.5], 2)
    1.75
    """
    total, alive = 1.0, 1.0
    for p in survival[:length]:
        alive *= p
        total += alive
    return total


def admitted(survivals: Sequence[Sequence[float]], seconds: Callable[[int], float],
             min_gain: float = MIN_GAIN) -> list[int]:
    """A batch's draft slots admitted to its forward: how many of each row's draft tokens to verify.

    Every row verifies its own next token anyway; each draft token is one more row of the forward
    (the products run on the tokens alone, :mod:`draftwise.models.batched_lm`). A slot is worth the
    probability that its token is accepted (its row's conditional acceptances multiplied up to it),
    so slots are taken best first — a row's own in order, as its worth only falls along it — and
    the batch admits the number of them with the most expected tokens per second of ``seconds(n)``
    (a forward over n tokens, rows included); none unless that promises ``min_gain`` × the rows
    alone. The best count, not the first that stops paying: a CPU's products work on rows in
    blocks, so a slot can cost a jump that the next few fill.

    >>> step = lambda n: 0.010 + 0.004 * ((n + 3) // 4)  # rows in blocks of four
    >>> admitted([[0.9, 0.9], [0.2, 0.2]], step)  # two rows: one block holds both rows and two slots
    [2, 0]
    >>> admitted([[0.95, 0.95, 0.95], [0.3, 0.3], [0.9]], step)  # a second block paid, its last slots are free
    [3, 1, 1]
    >>> admitted([[0.95] * 4] + [[]] * 7, step)  # a full batch of 8: a whole block for 3.5 tokens
    [4, 0, 0, 0, 0, 0, 0, 0]
    >>> admitted([[0.6] * 2] + [[]] * 7, step)  # … but not for 1
    [0, 0, 0, 0, 0, 0, 0, 0]
    """
    rows = len(survivals)
    slots = []
    for row, survival in enumerate(survivals):
        alive = 1.0
        for k, p in enumerate(survival):
            alive *= p
            slots.append((-alive, row, k))
    slots.sort()
    base = rows / seconds(rows)
    tokens, best, best_rate = float(rows), 0, base * min_gain
    for count, (worth, _, _) in enumerate(slots, start=1):
        tokens -= worth
        rate = tokens / seconds(rows + count)
        if rate > best_rate:
            best, best_rate = count, rate
    keep = [0] * rows
    for _, row, _ in slots[:best]:
        keep[row] += 1
    return keep


def priced_length(survival: Sequence[float], cost: Callable[[int], float], min_gain: float = MIN_GAIN) -> int:
    """The draft length (0 … len(survival)) with the most expected tokens per unit of ``cost`` (a
    round verifying n tokens, in plain rounds: ``cost(1)`` is 1); 0 unless some length promises
    ``min_gain`` × a plain round.

    >>> curve = {1: 1.0, 2: 1.06, 3: 1.14, 4: 1.21, 5: 1.62, 6: 1.75, 7: 1.83, 8: 1.92, 9: 2.0}.__getitem__
    >>> priced_length([0.7] * 8, curve), priced_length([0.9] * 8, curve), priced_length([0.05] * 8, curve)
    (3, 8, 0)
    """
    best, best_rate, total, alive = 0, min_gain, 1.0, 1.0
    for length, p in enumerate(survival, start=1):
        alive *= p
        total += alive
        rate = total / cost(length + 1)
        if rate > best_rate:
            best, best_rate = length, rate
    return best


GATE_FADE = 0.9  # per measured round of a load: what drafting earns there follows the answers in the batch
GATE_EXPLORE = 8  # a closed load still drafts every 8th round, so what drafting earns keeps being measured
GATE_NEED = 4  # measured rounds of a load before it may close


class DraftGate:
    """Whether a loaded batch's queries draft at all this round. Drafting is work every query does
    before the forward — its lookups, its learner's choice and update — and under load the forward
    admits few of its tokens (one more row costs nearly a plain row's share: an accepted token earns
    a few percent at most), so there the work can cost more than the tokens it earns. Per load (the
    rows' :func:`~draftwise.decision.step_costs.load_bucket`), a fading mean of each measured round's
    net seconds — its accepted tokens at a plain row's share of the forward, less what its admitted
    tokens added to the forward and what the drafting took — says whether drafting pays; where it does
    not, the queries decode plainly, except every ``explore``-th round of that load.

    >>> gate = DraftGate(need=2, explore=4)
    >>> gate.opens(8)
    True
    >>> for _ in range(2):
    ...     gate.observe(8, earned_s=0.001, spent_s=0.002)
    >>> [gate.opens(8) for _ in range(4)], gate.opens(2)  # closed at 8 rows but for its explorations
    ([False, False, False, True], True)
    """

    def __init__(self, fade: float = GATE_FADE, explore: int = GATE_EXPLORE, need: int = GATE_NEED) -> None:
        self.fade, self.explore, self.need = fade, explore, need
        self.net: dict[int, float] = {}  # load → fading sum of net seconds (its sign: the mean's)
        self.seen: dict[int, int] = {}
        self.closed: dict[int, int] = {}  # load → rounds asked while closed

    def opens(self, rows: int) -> bool:
        """Whether the queries of a round of ``rows`` rows draft."""
        load = load_bucket(rows)
        if self.seen.get(load, 0) < self.need or self.net[load] >= 0:
            return True
        asked = self.closed[load] = self.closed.get(load, 0) + 1
        return asked % self.explore == 0

    def observe(self, rows: int, earned_s: float, spent_s: float) -> None:
        """One drafting round of ``rows`` rows: the forward seconds its accepted tokens saved net of
        its admitted tokens' cost (``earned_s``), and its drafting's seconds (``spent_s``)."""
        load = load_bucket(rows)
        self.net[load] = self.fade * self.net.get(load, 0.0) + earned_s - spent_s
        self.seen[load] = self.seen.get(load, 0) + 1


def earned_seconds(prices: Callable[[int], float], rows: int, admitted_tokens: int, accepted: int) -> float:
    """The forward seconds a batch round's drafts earned: each accepted token at a plain row's share
    of a plain forward, less what its ``admitted_tokens`` added to the forward (``prices(n)``: a
    forward over n tokens).

    >>> round(earned_seconds(lambda n: 0.004 * n, rows=8, admitted_tokens=2, accepted=1), 6)
    -0.004
    """
    plain = prices(rows)
    return accepted * plain / rows - (prices(rows + admitted_tokens) - plain)
