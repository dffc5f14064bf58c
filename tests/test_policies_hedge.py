"""Full-information learners: NormalHedge's scale, AdaNormalHedge, QFI-D's delays, the games."""

from __future__ import annotations

import math

import numpy as np
import pytest

from draftwise.policies import make_policy
from draftwise.policies.delayed import DelayedFeedback, TokenGame
from draftwise.policies.hedge import (
    AdaNormalHedgeLearner,
    NormalHedgeLearner,
    adanormalhedge_probs,
    normalhedge_probs,
    normalhedge_scale,
)
from draftwise.trace import RoundRecord


def normalhedge_lhs(regrets: np.ndarray, c: float, prior: np.ndarray | None = None) -> float:
    pi = np.full(len(regrets), 1 / len(regrets)) if prior is None else prior / prior.sum()
    return float(pi @ np.exp(np.maximum(regrets, 0.0) ** 2 / (2 * c)))


@pytest.mark.parametrize("scale", [1e-3, 0.1, 1.0, 30.0, 1e3])
def test_normalhedge_scale_solves_its_equation(scale: float) -> None:
    rng = np.random.default_rng(int(scale * 1000))
    for n in (2, 7, 64):
        for _ in range(20):
            regrets = rng.normal(0, scale, size=n)
            regrets[0] = abs(regrets[0]) + 1e-9  # at least one positive regret
            c = normalhedge_scale(regrets)
            assert c > 0
            assert abs(normalhedge_lhs(regrets, c) - math.e) <= 1e-9 * math.e


def test_normalhedge_scale_with_a_prior_and_one_positive_regret() -> None:
    regrets = np.array([2.0, -1.0, -3.0])
    prior = np.array([0.2, 0.5, 0.3])
    c = normalhedge_scale(regrets, prior)
    assert abs(normalhedge_lhs(regrets, c, prior) - math.e) <= 1e-9 * math.e
    # one positive regret: 0.2·exp(4/2c) + 0.8 = e in closed form
    assert c == pytest.approx(4 / (2 * math.log((math.e - 0.8) / 0.2)), rel=1e-9)


def test_normalhedge_without_positive_regret_is_robust() -> None:
    assert math.isinf(normalhedge_scale(np.array([0.0, -1.0, -5.0])))
    assert math.isinf(normalhedge_scale(np.zeros(4)))
    p = normalhedge_probs(np.array([-1.0, -2.0, 0.0]))
    assert p.tolist() == pytest.approx([1 / 3] * 3)
    prior = np.array([1.0, 3.0])
    assert normalhedge_probs(np.array([-1.0, -1.0]), prior).tolist() == pytest.approx([0.25, 0.75])


def test_normalhedge_puts_weight_only_on_positive_regret() -> None:
    p = normalhedge_probs(np.array([3.0, 1.0, -2.0, 0.0]))
    assert p.sum() == pytest.approx(1.0)
    assert p[2] == 0.0 and p[3] == 0.0 and p[0] > p[1] > 0


def test_normalhedge_learner_regret_bookkeeping() -> None:
    learner = NormalHedgeLearner(3)
    learner.update(np.array([0.0, 0.5, 1.0]))  # uniform p: ℓ_A = 0.5
    assert learner.regrets.tolist() == pytest.approx([0.5, 0.0, -0.5])
    assert learner.probs().tolist() == pytest.approx([1.0, 0.0, 0.0])


def test_adanormalhedge_follows_the_best_and_survives_long_runs() -> None:
    learner = AdaNormalHedgeLearner(3)
    for _ in range(20_000):  # exp of R²/3C would overflow without log space
        learner.update(np.array([0.0, 0.6, 1.0]))
    p = learner.probs()
    assert np.isfinite(p).all() and p[0] > 0.99
    assert adanormalhedge_probs(np.zeros(2), np.zeros(2)).tolist() == pytest.approx([0.5, 0.5])


# -- QFI-D and the games -------------------------------------------------------------------------
def test_delayed_feedback_never_releases_before_reveal_and_keeps_fifo() -> None:
    rng = np.random.default_rng(0)
    queue = DelayedFeedback()
    pushed = []
    for i in range(200):
        reveal = int(rng.integers(0, 30))
        queue.push(np.array([float(i), float(reveal)]), available_at=reveal)
        pushed.append((i, reveal))
    seen: list[int] = []
    for now in range(0, 31):
        released = [int(v[0]) for v in queue.release(now)]
        for i in released:
            assert pushed[i][1] <= now  # never before its reveal round
        assert released == sorted(released)  # arrival order
        seen += released
    assert sorted(seen) == list(range(200)) and len(queue) == 0


def test_token_game_delays_length_losses_by_k_minus_one() -> None:
    game = TokenGame(n_arms=2, depth=4, kind="length")
    fed = 0
    rng = np.random.default_rng(0)
    for emitted in (3, 1, 5, 2, 4):
        fed += len(game.add(rng.random((2, emitted))))
        assert fed == max(0, game.frontier - 4 + 1)
    accept = TokenGame(n_arms=2, depth=4, kind="accept")
    assert len(accept.add(rng.random((2, 3)))) == 3  # acceptance losses are not delayed


def test_token_game_hybrid_uses_acceptance_first() -> None:
    game = TokenGame(n_arms=1, depth=3, kind="hybrid", switch=2)
    out = game.add(np.array([[0.2, 0.4, 1.0, 1.0, 0.0]]))
    assert [round(float(v[0]), 6) for v in out] == [0.8, 0.6, round(1 - (1 + 1 + 1) / 4, 6)]


def cf_record(index: int, gammas: np.ndarray, arm: int = 0) -> RoundRecord:
    k = gammas.shape[1]
    return RoundRecord(index=index, arm=arm, arm_name=str(arm), max_draft=4, drafted=4, accepted=k - 1,
                       emitted=k, position=0, counterfactual=gammas.tolist())


class SpyLearner:
    """Records what the policy feeds its base learner."""

    def __init__(self, n: int) -> None:
        self.seen: list[np.ndarray] = []
        self.n = n

    def probs(self) -> np.ndarray:
        return np.full(self.n, 1 / self.n)

    def update(self, losses: np.ndarray) -> None:
        self.seen.append(losses.copy())

    def decay(self, factor: float) -> None:
        pass


def test_policy_feeds_only_revealed_token_losses_before_each_decision() -> None:
    policy = make_policy("normalhedge:depth=4", ["a", "b", "c"], np.random.default_rng(0))
    policy.begin_query()
    spy = SpyLearner(3)
    policy.learner = spy
    rng = np.random.default_rng(1)
    verified = np.zeros((3, 0))
    for index, emitted in enumerate((2, 5, 1, 1, 3, 5)):
        policy.select()
        # everything fed so far must be computable from the positions verified before this decision
        assert len(spy.seen) == max(0, verified.shape[1] - 4 + 1)
        for t, losses in enumerate(spy.seen):
            window = verified[:, t : t + 4]
            expected = 1 - (1 + np.cumprod(window, axis=1).sum(axis=1)) / 5
            assert losses == pytest.approx(expected)
        gammas = rng.random((3, emitted))
        policy.update(0, cf_record(index, gammas))
        verified = np.concatenate([verified, gammas], axis=1)


def test_chunk_game_feeds_one_vector_per_round_and_skipping_updates_batches() -> None:
    policy = make_policy("normalhedge:game=chunk,warmup=2,every=3", ["a", "b"], np.random.default_rng(0))
    policy.begin_query()
    spy = SpyLearner(2)
    policy.learner = spy
    counts = []
    for index in range(9):
        policy.select()
        counts.append(len(spy.seen))
        policy.update(0, cf_record(index, np.full((2, 3), 0.5)))
    # rounds 0..2 update every decision (warm-up), then only at rounds 5 and 8
    assert counts == [0, 1, 2, 2, 2, 5, 5, 5, 8]
