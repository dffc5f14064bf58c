"""What a batched step costs, and each request's share of it (pure maths): vLLM's steps under the
draftwise proposer, and the batched rounds of draftwise's own engine.

A step verifies every scheduled request at once, so its measured time is shared. A linear model,
fitted online to the measured steps,

    T ≈ a + b·R + c·D + p·P     (R requests scheduled, D draft tokens, P prompt tokens beyond one
                                 per request — a draft token costs more than a prompt token: vLLM
                                 computes the target's distribution at every draft position)

splits it: request i's share is ``a/R + b + c·x_i`` (x_i: its draft tokens), and a plain step of
the same request at the same load would cost ``a/R + b``. The fixed part ``a`` is what makes
drafting nearly free at batch 1; ``c`` is what makes it expensive under load, where ``a/R`` is small.

Rewards are throughput: tokens emitted per second of the request's share of the step plus its own
(measured) drafting time. With ``time_unit="plain-step"`` (the default) the share is the fitted
model's — the model is refitted to every measured step, so it follows the machine, while one
step's own time on a shared CPU swings by ±50 % and would swamp the difference between arms —
and seconds are counted in units of the predicted plain step of that request at the current load:
a round without speculation is worth 1 token per unit at any batch size, so a learner's statistics
stay on one scale as the load moves, and drafting d tokens is worth it only when it emits more
than ``(a/R + b + c·d) / (a/R + b)`` tokens — the marginal rule for the whole batch's throughput
when the other requests decode plainly. With ``time_unit="seconds"`` the record holds raw seconds:
the measured step split in proportion to the model's shares.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# Prior guesses (seconds) for a small model on a CPU, each worth PRIOR_WEIGHT observations; the
# fit takes over after a few dozen steps.
PRIOR = (5e-3, 3e-4, 3e-4, 1e-4)
PRIOR_WEIGHT = 4.0
FORGET = 0.995  # per step: the fit follows a machine whose speed drifts (shared CPUs)
IDLE_FACTOR = 8.0  # a step this many times slower than predicted waited for work: not a cost sample
IDLE_MIN_S = 0.05
# Decisions that stop all drafting (the load cap at 0, a width cut) rest on the draft-token cost
# c, and a step without drafts says nothing of it. On the prior's guess alone (a CPU's: ~100× what
# an H200 pays at small sizes), or on one step whose drafts could not be told apart from its rows
# (the ridge then keeps the prior), the cap held the default to no drafts at batch 32 on an H200
# (0.64–0.78× plain decoding) and nothing ever corrected it. c counts as known once the measured
# steps pin it down this many times tighter (posterior variance) than the prior alone; until then
# the cap probes (StepCostModel.cap). The information forgets like the fit, so a cap that stays
# at 0 probes again once it has faded.
DRAFT_COST_KNOWN = 2.0
COST_FLOOR = (0.0, 1e-6, 1e-6, 0.0)
PRIOR_SCALE = (1.0, 64.0, 256.0, 1024.0)  # typical squared feature sizes: R ~ 8, D ~ 16, P ~ 32
REFIT_ALWAYS, REFIT_EVERY = 8, 8  # the fit is solved every step for the first 8, then every 8th
MODEL_PLAYS_KEPT = 32  # recent model-arm plays a model drafter's token cost is averaged over
MODEL_COST_KNOWN = 4  # model-arm plays measured before their cost per token decides (every lane / request)
PROBE_TOKENS = 64  # draft tokens of a step that measures their cost: one such step at batch 32 makes it known


@dataclass
class StepShape:
    """What one step verified: requests scheduled, draft tokens, other extra (prompt) tokens, and
    the measured seconds."""

    requests: int
    draft_tokens: int
    seconds: float
    prompt_tokens: int = 0

    def features(self) -> tuple[float, float, float, float]:
        return 1.0, float(self.requests), float(self.draft_tokens), float(self.prompt_tokens)

    def cost(self, coef: Sequence[float]) -> float:
        """``coef · features``."""
        a, b, c, p = (float(v) for v in coef)
        return a + b * self.requests + c * self.draft_tokens + p * self.prompt_tokens


class StepCostModel:
    """Ridge regression of step time on (1, R, D, P) with forgetting and a fixed prior."""

    def __init__(self, prior: tuple[float, ...] = PRIOR, weight: float = PRIOR_WEIGHT,
                 forget: float = FORGET) -> None:
        self.prior_mean = tuple(float(v) for v in prior)
        # Prior precision (diagonal) scaled to typical feature sizes, so each coefficient's prior is
        # worth ``weight`` typical steps.
        self.prior_prec = tuple(weight * scale for scale in PRIOR_SCALE)
        self.forget = forget
        # The forgetting sums Σ w·x·xᵀ and Σ w·x·seconds, in plain floats: right after a forward
        # every numpy call costs ≈ 10× its warm time (caches flushed), and numpy's fit was a fifth
        # of a 32-row round's bookkeeping.
        self.gram = [[0.0] * len(PRIOR_SCALE) for _ in PRIOR_SCALE]
        self.moment = [0.0] * len(PRIOR_SCALE)
        self.steps = 0
        self.coef: tuple[float, ...] = self.prior_mean  # a, b, c, p (seconds)
        self.draft_cost_known = False  # see DRAFT_COST_KNOWN
        # What a model drafter's draft token costs a lane (each play's drafting ÷ its tokens, first
        # plays included: draftwise.decision.core.model_cap). Like the step's own costs it is a
        # property of the drafters, the target and the device, so a Generator's sessions share it:
        # each new session used to try the model arms again while every row waited (4–5 plays a run
        # on an H200, 20–50 ms each against a 4 ms step).
        self.model_token_s: deque[float] = deque(maxlen=MODEL_PLAYS_KEPT)
        # … and how its drafts fared, (accepted, drafted) a play, where the driver verifies them
        self.model_verdicts: deque[tuple[int, int]] = deque(maxlen=MODEL_PLAYS_KEPT)

    def model_acceptance(self) -> float | None:
        """A model draft token's acceptance given the ones before it were, from the recent plays'
        verdicts (accepted tokens over accepted tokens and rejections); None while fewer than
        ``MODEL_COST_KNOWN`` plays are known.

        >>> costs = StepCostModel()
        >>> for verdict in [(1, 4), (4, 4), (0, 4), (3, 4)]:
        ...     costs.model_verdicts.append(verdict)
        >>> costs.model_acceptance()  # 8 accepted, 3 rejections
        0.7272727272727273
        """
        if len(self.model_verdicts) < MODEL_COST_KNOWN:
            return None
        accepted = sum(a for a, _ in self.model_verdicts)
        rejected = sum(a < d for a, d in self.model_verdicts)
        return accepted / (accepted + rejected) if accepted + rejected else None

    def cap(self, requests: int, max_len: int, acceptance: float, token_s: float = 0.0) -> int:
        """:func:`length_cap` on the fitted costs — once they rest on measured drafts. A step without
        drafts says nothing of ``c``, so a cap resting on the prior's ``c`` would never be undone.
        While ``c`` is unknown and the cap would cut drafts (at batch 1 it does not), steps alternate:
        a probe — at most ⌈PROBE_TOKENS / R⌉ tokens a request, enough to measure and cheap where
        drafts are dear — then a step without drafts, the contrast that tells a draft token's cost
        from a row's (steps that all draft alike, ``D = R × width``, never would)."""
        cap = length_cap(self.coef, requests, max_len, acceptance, token_s)
        if self.draft_cost_known or cap >= max_len:  # known, or drafting pays even at the guessed cost
            return cap
        return 0 if self.steps % 2 else min(max_len, math.ceil(PROBE_TOKENS / max(requests, 1)))

    def predict(self, shape: StepShape) -> float:
        return shape.cost(self.coef)

    def is_idle(self, shape: StepShape) -> bool:
        """A step far slower than predicted included waiting (an idle server), not work."""
        return shape.seconds > max(IDLE_MIN_S, IDLE_FACTOR * self.predict(shape))

    def observe(self, shape: StepShape) -> bool:
        """Add one measured step; False (and no update) for an idle or empty one. The fit is solved
        every step at first and at each drafted step while ``c`` is unknown, else every REFIT_EVERY
        steps: it moves little per step."""
        if shape.requests <= 0 or shape.seconds <= 0 or self.is_idle(shape):
            return False
        x, forget = shape.features(), self.forget  # the newest step weighs 1, each older one forget× less
        for i, (xi, row) in enumerate(zip(x, self.gram)):
            for j, xj in enumerate(x):
                row[j] = forget * row[j] + xi * xj
            self.moment[i] = forget * self.moment[i] + xi * shape.seconds
        self.steps += 1
        if (self.steps <= REFIT_ALWAYS or self.steps % REFIT_EVERY == 0
                or (not self.draft_cost_known and shape.draft_tokens > 0)):
            self._refit()
        return True

    def _refit(self) -> None:
        """Solve the ridge: coef = (G + Λ)⁻¹ (m + Λ·prior), Λ the prior's diagonal precision."""
        prec = self.prior_prec
        matrix = [[g + (prec[i] if i == j else 0.0) for j, g in enumerate(row)] for i, row in enumerate(self.gram)]
        covariance = invert_spd(matrix)  # the prior keeps it well conditioned
        # posterior variance of c ÷ the prior's: how much tighter the steps pin down a draft token's cost
        self.draft_cost_known = covariance[2][2] * prec[2] <= 1 / DRAFT_COST_KNOWN
        rhs = [m + p * mean for m, p, mean in zip(self.moment, prec, self.prior_mean)]
        coef = (sum(c * r for c, r in zip(row, rhs)) for row in covariance)
        self.coef = tuple(max(v, floor) for v, floor in zip(coef, COST_FLOOR))  # costs are never negative


def invert_spd(matrix: Sequence[Sequence[float]]) -> list[list[float]]:
    """The inverse of a small symmetric positive-definite matrix (Gauss–Jordan; its pivots are
    positive, so none is exchanged).

    >>> invert_spd([[4.0, 2.0], [2.0, 2.0]])
    [[0.5, -0.5], [-0.5, 1.0]]
    """
    n = len(matrix)
    rows = [[*map(float, row), *(1.0 if i == j else 0.0 for j in range(n))] for i, row in enumerate(matrix)]
    for k in range(n):
        pivot = rows[k][k]
        rows[k] = [v / pivot for v in rows[k]]
        for i in range(n):
            if i != k and rows[i][k] != 0.0:
                factor = rows[i][k]
                rows[i] = [v - factor * w for v, w in zip(rows[i], rows[k])]
    return [row[n:] for row in rows]


def request_share(coef: Sequence[float], requests: int, drafted: int) -> float:
    """Predicted seconds of one decoding request's part of a step: a/R + b + c·drafted."""
    a, b, c = (float(v) for v in coef[:3])
    return a / max(requests, 1) + b + c * drafted


def measured_shares(coef: Sequence[float], shape: StepShape, drafted: Sequence[int]) -> list[float]:
    """Each request's seconds of a measured step: the step's seconds split in proportion to the
    predicted shares a/R + b + c·drafted (one prediction of the whole step for all of them).

    >>> shares = measured_shares((0.004, 0.0, 0.001, 0.0), StepShape(2, 4, 0.012), [0, 4])
    >>> [round(s, 6) for s in shares]  # predicted 0.002 and 0.006 of 0.008; measured 1.5× that
    [0.003, 0.009]
    """
    plain, c = request_share(coef, shape.requests, 0), float(coef[2])  # once, not per row (batches of 32)
    scale = shape.seconds / shape.cost(coef)
    return [scale * (plain + c * d) for d in drafted]


@dataclass(frozen=True)
class RoundTimes:
    """One request's round in the unit chosen: verification share and its own drafting."""

    verify: float
    draft: float


def attribute(coef: Sequence[float], shape: StepShape, extra: int, draft_s: float, unit: str) -> RoundTimes:
    """One request's part of the step, in ``unit`` (see the module docstring).

    >>> coef = (0.004, 0.0, 0.001, 0.0)
    >>> t = attribute(coef, StepShape(requests=1, draft_tokens=4, seconds=0.008), 4, 0.0, "plain-step")
    >>> round(t.verify, 6)  # at batch 1, 4 draft tokens make the step twice a plain one
    2.0
    >>> round(attribute(coef, StepShape(4, 4, 0.008), 4, 0.0, "plain-step").verify, 6)  # at batch 4: 5×
    5.0
    """
    if unit == "seconds":
        return RoundTimes(measured_shares(coef, shape, [extra])[0], draft_s)
    share = request_share(coef, shape.requests, extra)
    plain = request_share(coef, shape.requests, 0)
    return RoundTimes(share / plain, draft_s / plain)


def batch_times(coef: Sequence[float], shape: StepShape, decode_requests: int, draft_s: float, unit: str) -> RoundTimes:
    """The whole step for the batch-level learner: with ``plain-step``, in units of the predicted
    plain step per decoding request (so tokens per unit = tokens per request per plain step: a
    plain step earns 1 at any load).

    >>> coef = (0.004, 0.001, 0.001, 0.0)
    >>> t = batch_times(coef, StepShape(requests=4, draft_tokens=8, seconds=0.02), 4, 0.0, "plain-step")
    >>> round(t.verify, 6)  # predicted 0.016 s against a plain step's 0.008 s for 4 requests
    8.0
    """
    if unit == "seconds":
        return RoundTimes(shape.seconds, draft_s)
    plain_shape = StepShape(shape.requests, 0, shape.seconds, shape.prompt_tokens)
    plain = plain_shape.cost(coef) / max(decode_requests, 1)
    return RoundTimes(shape.cost(coef) / plain, draft_s / plain)


@dataclass(frozen=True)
class CutRound:
    """A batch's round as it would have gone with every chain draft cut to one length."""

    drafted: int  # draft tokens, summed over rows
    accepted: int
    emitted: int
    width: int  # the longest draft


def cut_round(rows: Sequence[tuple[int, int, int]], length: int | None) -> CutRound:
    """Rows' ``(drafted, accepted, emitted)`` had each chain draft been cut to ``length`` (None: as
    played). A shorter chain is a prefix of the drafted one, so it keeps min(accepted, length) of
    its tokens and then emits the target's own one — what a shorter draft length reveals for free
    (the side observations of the batch-level learners).

    >>> cut_round([(4, 3, 4), (0, 0, 1), (2, 0, 1)], 2)
    CutRound(drafted=4, accepted=2, emitted=5, width=2)
    """
    cap = sys.maxsize if length is None else length
    accepted = [min(a, cap) for _, a, _ in rows]
    return CutRound(drafted=sum(min(d, cap) for d, _, _ in rows), accepted=sum(accepted),
                    emitted=sum(min(e, a + 1) for (_, _, e), a in zip(rows, accepted)),
                    width=max((min(d, cap) for d, _, _ in rows), default=0))


class DraftSurvival:
    """P(the k-th draft token is accepted | the k − 1 before it were), per position k, from a
    batch's recent chain verdicts (counts fading by ``fade`` a round; prior: ``prior`` at weight
    ``weight``). Conditioning on the position is what a single acceptance rate misses: drafts are
    bimodal (a long lookup match is accepted nearly whole, a guess soon fails), and the survivors
    of the first tokens are mostly the former."""

    def __init__(self, max_len: int, prior: float = 0.9, weight: float = 4.0, fade: float = 0.99) -> None:
        self.fade = fade
        self.tried = [weight] * (max_len + 1)  # index k: the k-th token (1-based; 0 unused)
        self.kept = [weight * prior] * (max_len + 1)

    def observe(self, verdicts: Sequence[tuple[int, int]]) -> None:
        """One round's ``(drafted, accepted)`` per chain."""
        fade = self.fade
        tried, kept = [t * fade for t in self.tried], [k * fade for k in self.kept]
        for drafted, accepted in verdicts:
            for k in range(1, min(drafted, accepted + 1, len(tried) - 1) + 1):  # reached: the ones before held
                tried[k] += 1.0
                kept[k] += k <= accepted
        self.tried, self.kept = tried, kept

    def expected_accepted(self, longest: int) -> list[float]:
        """E[tokens accepted] of a draft of k tokens, for k = 0..longest."""
        out, alive = [0.0], 1.0
        for k in range(1, longest + 1):
            j = min(k, len(self.tried) - 1)
            alive *= self.kept[j] / self.tried[j]
            out.append(out[-1] + alive)
        return out


def best_width(coef: Sequence[float], drafts: Sequence[int], expected: Sequence[float]) -> int:
    """The width to cut a padded batch's drafts to: the forward pads every row to the longest draft
    (cost ≈ a + b·R + c·R·width), so one row's long draft makes every row pay for its length. The
    width maximizes (R + Σ_rows E[accepted of min(d, width)]) / predicted cost; ``expected[k]`` is
    E[accepted] of a k-token draft (:meth:`DraftSurvival.expected_accepted`).

    >>> coef = (8e-3, 5e-4, 1e-3, 0.0)
    >>> sure = [0.0, 0.9, 1.8, 2.7, 3.6, 4.5, 5.4, 6.3, 7.2]
    >>> best_width(coef, [8], sure), best_width(coef, [8, 0, 0, 0], sure), best_width(coef, [8] * 4, sure)
    (8, 0, 8)
    """
    a, b, c = (float(v) for v in coef[:3])
    rows, longest = len(drafts), max(drafts, default=0)
    count = [0] * (longest + 1)  # rows by draft length: one pass over the rows, not one per width
    for d in drafts:
        count[d] += 1
    shorter, reaching = 0.0, rows  # Σ E[accepted] of the drafts shorter than the width; rows at least as long
    best, best_rate = 0, -1.0
    for width in range(longest + 1):
        tokens = rows + shorter + reaching * expected[width]
        rate = tokens / (a + b * rows + c * rows * width)
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = width, rate
        shorter += count[width] * expected[width]
        reaching -= count[width]
    return best


def load_bucket(requests: int) -> int:
    """Batch-size bucket for contextual learners: 0 for 1 request, 1 for 2–3, … 5 for ≥ 32.

    >>> [load_bucket(n) for n in (1, 2, 4, 8, 16, 32, 64)]
    [0, 1, 2, 3, 4, 5, 5]
    """
    return min(5, int(math.log2(max(requests, 1))))


MIN_GAIN = 1.1  # a length must promise 10 % over a plain step: the cost model is an estimate


def length_cap(coef: Sequence[float], requests: int, max_len: int, acceptance: float, token_s: float = 0.0) -> int:
    """The draft length worth the most at this load for a drafter whose every token is accepted
    with probability ``acceptance`` (an optimistic one, 0.9 by default): argmax over L of
    (1 + Σ_{k≤L} α^k) / (1 + L·c / (a/R + b)), 0 when no length promises ``MIN_GAIN`` × a plain step.

    Under load a draft token costs about as much as a whole request's plain step, and then not
    even a good drafter pays: the cap is 0 and the proposer skips drafting — and its learners —
    altogether.

    >>> coef = (8e-3, 5e-4, 1e-3, 0.0)
    >>> [length_cap(coef, r, 8, 0.9) for r in (1, 4, 16, 32)]
    [8, 4, 0, 0]

    ``token_s``: what drafting one token costs besides verifying it (a model drafter's forward,
    which in a batch holds up every row): a model drafter stops paying at a lower load.

    >>> [length_cap(coef, r, 8, 0.9, token_s=2e-3) for r in (1, 4)]
    [4, 0]
    """
    ratio = (float(coef[2]) + token_s) / request_share(coef, requests, 0)
    best, best_len, gained = MIN_GAIN, 0, 1.0
    for length in range(1, max_len + 1):
        gained += acceptance**length
        value = gained / (1.0 + length * ratio)
        if value > best:
            best, best_len = value, length
    return best_len


def model_draft_cap(coef: Sequence[float], requests: int, max_len: int, acceptance: float, token_costs: Sequence[float],
                    summary: Callable[[Sequence[float]], float] = statistics.fmean) -> int:
    """:func:`length_cap` for a model drafter, its drafting cost per token (``summary`` of the recent
    plays' ``token_costs``) counted besides verification: its forwards run query by query while
    every row waits, so under load no length of it pays. ``max_len`` while fewer than
    ``MODEL_COST_KNOWN`` plays are measured, or when the cap is off (``acceptance`` 0)."""
    if acceptance <= 0 or len(token_costs) < MODEL_COST_KNOWN:
        return max_len
    return length_cap(coef, requests, max_len, acceptance, summary(token_costs))


class PlainRounds:
    """What a round without speculation costs one query alone (seconds, drafting and choosing
    included): the median of the latest ``keep`` measured rounds that drafted nothing.

    The single-query engine credits its learner with this counterfactual every drafted round (see
    :meth:`draftwise.engine.loop.Engine.credit_plain`). A model of drafted rounds cannot give it: on
    a CPU target the first extra token costs far more than the next ones (MEASURED.md: 1 token
    6.0 ms, 5 tokens 10.4, 9 tokens 12.6), so a line through drafted rounds misses a plain one by a
    third. The engine plays a plain round itself while fewer than ``need`` are known or none was
    seen for ``refresh`` rounds (``due``) — at most one round in ``refresh`` once the clock is set.

    >>> clock = PlainRounds(keep=3, need=2)
    >>> clock.due(), clock.seconds()
    (True, None)
    >>> for seconds, drafted in [(0.004, 0), (0.009, 4), (0.006, 0), (0.005, 0)]:
    ...     clock.observe(seconds, drafted)
    >>> clock.due(), clock.seconds()
    (False, 0.005)
    """

    def __init__(self, keep: int = 8, need: int = 3, refresh: int = 200) -> None:
        self.times: deque[float] = deque(maxlen=keep)
        self.need, self.refresh = need, refresh
        self.since = 0  # rounds since the latest plain one

    def observe(self, seconds: float, drafted: int) -> None:
        self.since += 1
        if drafted == 0 and seconds > 0:
            self.times.append(seconds)
            self.since = 0

    def due(self) -> bool:
        return len(self.times) < self.need or self.since >= self.refresh

    def seconds(self) -> float | None:
        return statistics.median(self.times) if len(self.times) >= self.need else None


PLAIN_NEED = 4  # plain steps measured at a load before its rate counts
PLAIN_EVERY = 32  # one step of a load in this many kept plain, so that its rate stays measured
PLAIN_FADE = 0.9  # per plain step of a load


class PlainRate:
    """Tokens per second of steps without drafts, per load (:func:`load_bucket` of the requests
    decoding), from fading sums of their tokens and seconds. Where a step's cost cannot be priced
    reliably (vLLM's, whose draft tokens always come with the rows that drafted them, so a fit
    cannot tell a draft token's cost from a row's), this is what a drafting step is measured against:
    it earned ``tokens / rate`` seconds of plain decoding in the seconds it took. Plain steps come
    by themselves (a load cap's probes alternate with them, an admission may cut every draft); a
    driver also keeps every ``every``-th step of a load plain (``due``), so that it stays measured.

    >>> plain = PlainRate(need=2, every=4)
    >>> plain.observe(8, tokens=8, seconds=0.04)
    >>> plain.rate(8), [plain.due(8) for _ in range(4)]
    (None, [False, False, False, True])
    >>> plain.observe(9, tokens=9, seconds=0.05)
    >>> round(plain.rate(8), 1)
    188.4
    """

    def __init__(self, need: int = PLAIN_NEED, every: int = PLAIN_EVERY, fade: float = PLAIN_FADE) -> None:
        self.need, self.every, self.fade = need, every, fade
        self.tokens: dict[int, float] = {}
        self.seconds: dict[int, float] = {}
        self.seen: dict[int, int] = {}
        self.asked: dict[int, int] = {}

    def due(self, requests: int) -> bool:
        """Whether a step of ``requests`` requests is kept plain, to measure the rate."""
        load = load_bucket(requests)
        asked = self.asked[load] = self.asked.get(load, 0) + 1
        return asked % self.every == 0

    def observe(self, requests: int, tokens: int, seconds: float) -> None:
        """One measured step without drafts: the ``tokens`` its requests emitted in ``seconds``."""
        load = load_bucket(requests)
        self.tokens[load] = self.fade * self.tokens.get(load, 0.0) + tokens
        self.seconds[load] = self.fade * self.seconds.get(load, 0.0) + seconds
        self.seen[load] = self.seen.get(load, 0) + 1

    def rate(self, requests: int) -> float | None:
        """Tokens per second of a plain step at this load (None until ``need`` are measured)."""
        load = load_bucket(requests)
        if self.seen.get(load, 0) < self.need:
            return None
        return self.tokens[load] / self.seconds[load]
