"""Full-information learners (HedgeSpec): Hedge, NormalHedge, AdaNormalHedge.

After each round the engine gives every drafter's acceptance probabilities along the verified
tokens (``record.counterfactual``), so every arm gets a loss each round, not just the played one.
The losses are HedgeSpec's (``draftwise.policies.feedback``): acceptance probability, Theorem 3 length, or
the hybrid schedule, in a chunk-level game (one loss vector per round, censored at the verified
tokens, §B.3) or the token-level game (one per verified token, revealed with a delay, §3.3) fed
through QFI-D (§B.1, ``draftwise.policies.delayed``).

The base learners are small classes over numpy arrays: ``probs()`` and ``update(losses)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from draftwise.errors import DraftwiseError
from draftwise.policies.base import Policy, register_policy
from draftwise.policies.delayed import DelayedFeedback, TokenGame
from draftwise.policies.exp3 import sample, softmax
from draftwise.policies.feedback import acceptance_loss, counterfactual_matrix, length_loss
from draftwise.trace import RoundRecord

E = math.e


# -- NormalHedge's scale c_t ------------------------------------------------------------------
def normalhedge_scale(
    regrets: np.ndarray, prior: np.ndarray | None = None, start: float | None = None, rtol: float = 1e-12
) -> float:
    """The c > 0 with Σ_i π_i exp([R_i]₊² / (2c)) = e (HedgeSpec Fig. 7, π uniform = the mean).

    Returns ``inf`` when no regret is positive: the left side is then 1 for every c, there is no
    solution, and the caller falls back to the prior. Solved for u = 1/(2c) by Newton's method:
    g(u) = Σ π exp(u s) − e is increasing and convex, so from any start one step lands right of
    the root and the iterates then decrease monotonically onto it (quadratic convergence). ``start``
    (the previous round's c) saves iterations; the default start is a point right of the root.

    >>> c = normalhedge_scale(np.array([1.0, -1.0]))
    >>> round(0.5 * (math.exp(1.0 / (2 * c)) + 1.0), 12) == round(math.e, 12)
    True
    """
    positive = np.maximum(np.asarray(regrets, dtype=float), 0.0)
    s = positive * positive
    s_max = float(s.max()) if len(s) else 0.0
    if s_max <= 0.0:
        return math.inf
    pi = _normalised(prior, len(s))
    j = int(np.argmax(s))
    u_right = (1.0 - math.log(pi[j])) / s_max  # π_j exp(u s_j) = e, so g(u_right) ≥ 0
    u = u_right
    if start is not None and math.isfinite(start) and start > 0:
        u = min(1.0 / (2.0 * start), u_right)
    for _ in range(200):
        ex = np.exp(u * s)
        g = float(pi @ ex) - E
        if abs(g) <= rtol * E:
            break
        slope = float(pi @ (s * ex))
        if not slope > 0:
            break
        step = g / slope
        if g > 0 and step >= u:  # only round-off can do this: stop at the best iterate
            break
        u = min(u - step, u_right)
    return 1.0 / (2.0 * u)


def normalhedge_probs(regrets: np.ndarray, prior: np.ndarray | None = None, c: float | None = None) -> np.ndarray:
    """p_i ∝ π_i ([R_i]₊/c) exp([R_i]₊²/(2c)); the prior π when no regret is positive.

    ``c`` defaults to :func:`normalhedge_scale` of the regrets.
    """
    pi = _normalised(prior, len(regrets))
    if c is None:
        c = normalhedge_scale(regrets, pi)
    if math.isinf(c):
        return pi
    positive = np.maximum(regrets, 0.0)
    w = pi * positive * np.exp(positive * positive / (2.0 * c))
    return w / w.sum()


def adanormalhedge_probs(regrets: np.ndarray, abs_sums: np.ndarray, prior: np.ndarray | None = None) -> np.ndarray:
    """AdaNormalHedge (Luo & Schapire 2015): p_i ∝ π_i w(R_i, C_i), the prior when all w are 0.

    w(R, C) = ½ (Φ(R+1, C+1) − Φ(R−1, C+1)), Φ(R, C) = exp([R]₊²/(3C)); computed in log space.
    """
    pi = _normalised(prior, len(regrets))
    a = np.maximum(regrets + 1.0, 0.0) ** 2 / (3.0 * (abs_sums + 1.0))
    b = np.maximum(regrets - 1.0, 0.0) ** 2 / (3.0 * (abs_sums + 1.0))
    positive = a > b
    if not positive.any():
        return pi
    with np.errstate(divide="ignore"):
        log_w = np.where(positive, a + np.log1p(-np.exp(np.minimum(b - a, 0.0))), -np.inf) + np.log(pi)
    return softmax(log_w)


def _normalised(prior: np.ndarray | None, n: int) -> np.ndarray:
    if prior is None:
        return np.full(n, 1.0 / n)
    return prior / prior.sum()


# -- base learners ------------------------------------------------------------------------------
class HedgeLearner:
    """Hedge / exponential weights: p ∝ π exp(−η L); η constant or, when 0, sqrt(8 ln N / t)."""

    learned: ClassVar[tuple[str, ...]] = ("cum_loss", "t")

    def __init__(self, n: int, eta: float = 0.0, prior: np.ndarray | None = None) -> None:
        self.eta = eta
        self.prior = _normalised(prior, n)
        self.cum_loss = np.zeros(n)
        self.t = 0.0

    def rate(self) -> float:
        n = len(self.cum_loss)
        return self.eta if self.eta > 0 else math.sqrt(8.0 * math.log(max(n, 2)) / max(self.t, 1.0))

    def probs(self) -> np.ndarray:
        return softmax(np.log(self.prior) - self.rate() * self.cum_loss)

    def update(self, losses: np.ndarray) -> None:
        self.cum_loss += losses
        self.t += 1

    def decay(self, factor: float) -> None:
        self.cum_loss *= factor
        self.t *= factor


class NormalHedgeLearner:
    """NormalHedge (Chaudhuri et al. 2009; HedgeSpec Fig. 7): parameter-free, regret-driven."""

    learned: ClassVar[tuple[str, ...]] = ("regrets", "scale", "_probs")

    def __init__(self, n: int, prior: np.ndarray | None = None) -> None:
        self.prior = _normalised(prior, n)
        self.regrets = np.zeros(n)
        self.scale = math.inf  # c_t of the last update
        self._probs = self.prior.copy()

    def probs(self) -> np.ndarray:
        return self._probs

    def update(self, losses: np.ndarray) -> None:
        mixed = float(self._probs @ losses)  # the learner's loss ℓ_A = Σ p_i ℓ_i
        self.regrets += mixed - losses
        self._refresh()

    def decay(self, factor: float) -> None:
        self.regrets *= factor
        self.scale = math.inf
        self._refresh()

    def _refresh(self) -> None:
        # c_t moves little between updates: start Newton from the previous one
        self.scale = normalhedge_scale(self.regrets, self.prior, start=self.scale)
        self._probs = normalhedge_probs(self.regrets, self.prior, self.scale)


class AdaNormalHedgeLearner:
    """AdaNormalHedge (Luo & Schapire 2015): regrets R and their absolute sums C per arm."""

    learned: ClassVar[tuple[str, ...]] = ("regrets", "abs_sums", "_probs")

    def __init__(self, n: int, prior: np.ndarray | None = None) -> None:
        self.prior = _normalised(prior, n)
        self.regrets = np.zeros(n)
        self.abs_sums = np.zeros(n)
        self._probs = self.prior.copy()

    def probs(self) -> np.ndarray:
        return self._probs

    def update(self, losses: np.ndarray) -> None:
        instant = float(self._probs @ losses) - losses
        self.regrets += instant
        self.abs_sums += np.abs(instant)
        self._probs = adanormalhedge_probs(self.regrets, self.abs_sums, self.prior)

    def decay(self, factor: float) -> None:
        self.regrets *= factor
        self.abs_sums *= factor
        self._probs = adanormalhedge_probs(self.regrets, self.abs_sums, self.prior)


# -- the policy shell -------------------------------------------------------------------------
GAMES = ("token", "chunk")
LOSS_KINDS = ("accept", "length", "hybrid")
CHOICES = ("sample", "argmax")


class FullInformationPolicy(Policy):
    """A full-information learner over drafters, fed HedgeSpec's losses through QFI-D.

    Options: ``loss`` accept | length | hybrid (acceptance loss for the first ``switch`` loss
    vectors, then length; §B.5); ``game`` token (one loss per verified token, delayed, §3.3) |
    chunk (one per round, censored, §B.3); ``depth`` K of the token-level length loss (0: the
    rounds' draft budget L); ``choose`` sample (draw from the weights, as in HedgeSpec) | argmax;
    ``warmup`` / ``every``: §B.5's skipping updates — after ``warmup`` rounds, feed the queue to
    the learner only every ``every`` rounds (defaults: every round); ``skip``: after ``warmup``
    rounds, run the engine's evaluation phase only once ``skip`` verified tokens have gathered
    (0: every round), so the drafters are evaluated in fewer, larger batches.
    A warm-start prior is a weight per arm: π_i ∝ prior_i ** prior_weight.
    """

    full_information = True
    learned: ClassVar[tuple[str, ...]] = ("learner",)  # the queue and the token game last one query

    def __init__(
        self,
        arms: Sequence[str],
        rng: np.random.Generator,
        *,
        loss: str = "length",
        game: str = "token",
        switch: int = 3,
        depth: int = 0,
        choose: str = "sample",
        warmup: int = 0,
        every: int = 1,
        skip: int = 0,
        **common: Any,
    ) -> None:
        for name, value, valid in (("loss", loss, LOSS_KINDS), ("game", game, GAMES), ("choose", choose, CHOICES)):
            if value not in valid:
                raise DraftwiseError(f"{name}={value!r} is not valid; valid: {', '.join(valid)}")
        if every < 1 or warmup < 0 or depth < 0 or switch < 0 or skip < 0:
            raise DraftwiseError("need every >= 1, warmup >= 0, depth >= 0, switch >= 0 and skip >= 0")
        self.skip = skip
        self.loss, self.game, self.switch, self.depth = loss, game, switch, depth
        self.choose, self.warmup, self.every = choose, warmup, every
        self.pi: np.ndarray | None = None
        super().__init__(arms, rng, **common)

    def make_learner(self) -> Any:
        raise NotImplementedError

    def reset(self) -> None:
        self.learner = self.make_learner()
        self.start_query()

    def start_query(self) -> None:
        self.queue = DelayedFeedback()
        self.token_game: TokenGame | None = None
        self.rounds = 0
        self.fed = 0  # loss vectors given to the base learner (for tests and the trace)

    def warm_start(self, means: np.ndarray, weight: float) -> None:
        pi = np.clip(np.asarray(means, dtype=float), 1e-12, None) ** weight
        self.pi = pi / pi.sum()
        self.learner = self.make_learner()

    def decay_state(self, factor: float) -> None:
        self.learner.decay(factor)

    # -- decisions --------------------------------------------------------------------------
    def select(self) -> int:
        if self.rounds <= self.warmup or (self.rounds - self.warmup) % self.every == 0:
            for losses in self.queue.release(self.rounds):  # QFI-D: all revealed, FIFO
                self.learner.update(losses)
                self.fed += 1
        p = self.learner.probs()
        if self.choose == "argmax":
            return int(np.argmax(p))
        return sample(p, self.rng)

    def probs(self) -> np.ndarray:
        return self.learner.probs()

    def wants_evaluation(self, rounds: int, pending_tokens: int) -> bool:
        return rounds <= self.warmup or self.skip == 0 or pending_tokens >= self.skip

    # -- feedback ---------------------------------------------------------------------------
    def update(self, arm: int, record: RoundRecord) -> float | None:
        gammas = counterfactual_matrix(record)  # (arms, verified positions of this round)
        if gammas.shape[0] != self.n_arms:
            raise DraftwiseError(f"counterfactual has {gammas.shape[0]} arms, the policy has {self.n_arms}")
        use_accept = self.loss == "accept" or (self.loss == "hybrid" and record.index < self.switch)
        chunk = acceptance_loss(gammas) if use_accept else length_loss(gammas)
        self.rounds += 1
        if self.game == "chunk":
            self.queue.push(chunk, available_at=self.rounds)
        else:
            if self.token_game is None:
                depth = self.depth or record.max_draft
                self.token_game = TokenGame(self.n_arms, max(depth, 1), self.loss, self.switch)
            for losses in self.token_game.add(gammas):
                self.queue.push(losses, available_at=self.rounds)
        return float(chunk[arm])  # the played arm's chunk loss, for the trace

    def observe_losses(self, losses: Sequence[float]) -> None:
        """Feed one loss vector directly (already revealed), bypassing the games."""
        vector = np.asarray(losses, dtype=float)
        if vector.shape != (self.n_arms,):
            raise DraftwiseError(f"expected {self.n_arms} losses, got shape {vector.shape}")
        self.queue.push(vector, available_at=self.rounds)

    def observe(self, arm: int, reward: float) -> None:
        raise DraftwiseError(f"{type(self).__name__} learns from full-information losses, not one arm's reward")

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "loss": self.loss,
            "game": self.game,
            "rounds": self.rounds,
            "fed": self.fed,
            "pending": len(self.queue),
            "probs": self.probs().tolist(),
        }


@register_policy("hedge")
class HedgePolicy(FullInformationPolicy):
    """Hedge over drafters (HedgeSpec ablation, Tables 9–10)."""

    summary = "Hedge (full information): exponential weights, η fixed or anytime sqrt(8 ln N / t) when 0"

    def __init__(self, arms: Sequence[str], rng: np.random.Generator, *, eta: float = 0.0, **options: Any) -> None:
        if eta < 0:
            raise DraftwiseError(f"hedge: eta must be >= 0, got {eta}")
        self.eta = eta
        super().__init__(arms, rng, **options)

    def make_learner(self) -> HedgeLearner:
        return HedgeLearner(self.n_arms, self.eta, self.pi)


@register_policy("normalhedge")
class NormalHedgePolicy(FullInformationPolicy):
    """HedgeSpec's default learner: NormalHedge with the length loss in the token-level game."""

    summary = "HedgeSpec NormalHedge (full information, parameter-free), length loss, token-level game + QFI-D"

    def __init__(self, arms: Sequence[str], rng: np.random.Generator, **options: Any) -> None:
        super().__init__(arms, rng, **options)

    def make_learner(self) -> NormalHedgeLearner:
        return NormalHedgeLearner(self.n_arms, self.pi)


@register_policy("adanormalhedge")
class AdaNormalHedgePolicy(FullInformationPolicy):
    """AdaNormalHedge over drafters (HedgeSpec ablation, Tables 9–10)."""

    summary = "AdaNormalHedge (full information, Luo & Schapire 2015), HedgeSpec's losses and games"

    def __init__(self, arms: Sequence[str], rng: np.random.Generator, **options: Any) -> None:
        super().__init__(arms, rng, **options)

    def make_learner(self) -> AdaNormalHedgeLearner:
        return AdaNormalHedgeLearner(self.n_arms, self.pi)
