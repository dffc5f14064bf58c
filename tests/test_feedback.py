"""Feedback signals and HedgeSpec's losses, including Theorem 3's unbiasedness by Monte Carlo."""

from __future__ import annotations

import numpy as np
import pytest

from draftwise.errors import DraftwiseError
from draftwise.policies.feedback import (
    LOSSES,
    SIGNALS,
    expected_accept_length,
    length_loss,
    loss_function,
    signal,
    token_losses,
)
from draftwise.trace import RoundRecord


def record(**fields: object) -> RoundRecord:
    base = dict(index=0, arm=0, arm_name="a", max_draft=5, drafted=4, accepted=2, emitted=3, position=0)
    base.update(fields)
    return RoundRecord(**base)  # type: ignore[arg-type]


def test_bandit_signals() -> None:
    r = record(accept_probs=[0.9, 0.8, 0.2, 0.5], draft_s=0.02, verify_s=0.04)
    assert signal("be")(r) == pytest.approx(2 / 5)
    assert signal("bd")(r) == pytest.approx(0.6)
    assert signal("length")(r) == 3.0
    assert signal("throughput")(r) == pytest.approx(3 / 0.06)
    assert signal("blend")(r) == pytest.approx(0.5 * 2 / 5 + 0.5 * 2 / 4)
    assert signal("blend:alpha=1")(r) == pytest.approx(2 / 5)
    assert signal("expected_length")(r) == pytest.approx(1 + 0.9 + 0.72 + 0.144 + 0.072)


def test_signals_handle_empty_rounds() -> None:
    r = record(max_draft=0, drafted=0, accepted=0, emitted=1)
    for name in ("be", "bd", "blend", "throughput"):
        assert signal(name)(r) == 0.0
    assert signal("expected_length")(r) == 1.0


def test_bad_signal_names_and_options_are_clear_errors() -> None:
    with pytest.raises(DraftwiseError, match="valid: "):
        signal("bdd")
    with pytest.raises(DraftwiseError, match="alpha"):
        signal("blend:alpha=2")
    with pytest.raises(DraftwiseError, match="valid options"):
        signal("blend:beta=0.1")


def test_registries_hold_every_signal_of_the_issue() -> None:
    assert {"be", "bd", "length", "throughput", "blend", "expected_length"} <= set(SIGNALS)
    assert {"accept", "length", "hybrid"} <= set(LOSSES)


def test_expected_accept_length_matches_the_definition() -> None:
    rng = np.random.default_rng(0)
    for k in range(0, 7):
        g = rng.random(k)
        full = np.append(g, 0.0)  # γ_{K+1} = 0
        direct = sum((j + 1) * (1 - full[j]) * np.prod(full[:j]) for j in range(k + 1))
        assert expected_accept_length(g) == pytest.approx(direct)
    assert expected_accept_length(np.ones(4)) == 5.0 and expected_accept_length(np.zeros(4)) == 1.0


def test_chunk_losses_from_the_counterfactual() -> None:
    cf = [[1.0, 1.0, 0.0], [0.5, 0.5, 0.5]]
    r = record(counterfactual=cf, index=5)
    assert loss_function("accept")(r).tolist() == pytest.approx([1 / 3, 0.5])
    assert loss_function("length")(r).tolist() == pytest.approx([1 - 3 / 4, 1 - 1.875 / 4])
    assert loss_function("hybrid")(r).tolist() == loss_function("length")(r).tolist()  # index 5 ≥ 3
    assert loss_function("hybrid:switch=10")(r).tolist() == loss_function("accept")(r).tolist()
    with pytest.raises(DraftwiseError, match="full-information"):
        loss_function("length")(record())


def test_token_losses_need_k_positions() -> None:
    g = np.array([[1.0, 1.0, 1.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
    out = token_losses(g, depth=3, kind="length")
    assert out.shape == (2, 2)  # positions 1 and 2 have their K = 3 window; 3 and 4 do not yet
    assert out[0].tolist() == pytest.approx(length_loss(g[:, 0:3]).tolist())
    assert token_losses(g, depth=3, kind="accept").shape == (4, 2)


# -- Theorem 3 against Monte Carlo rollouts ------------------------------------------------------
def markov_chain(seed: int, vocab: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """A target p(x_t | x_{t−1}) and a drafter q(x_t | x_{t−1}): (vocab, vocab) row-stochastic."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, 0.6), size=vocab)
    q = 0.5 * p + 0.5 * rng.dirichlet(np.full(vocab, 0.6), size=vocab)
    return p, q


def speculative_round(p: np.ndarray, q: np.ndarray, prev: int, k: int, rng: np.random.Generator) -> int:
    """One real speculative-sampling round (Leviathan et al.): tokens accepted + 1."""
    for j in range(k):
        x = rng.choice(len(q), p=q[prev])
        if rng.random() >= min(1.0, p[prev, x] / q[prev, x]):
            return j + 1  # rejected at position j: j accepted + the correction token
        prev = x
    return k + 1  # all accepted + the bonus token


def estimator_on_target_rollout(p: np.ndarray, q: np.ndarray, prev: int, k: int, rng: np.random.Generator) -> float:
    """Theorem 3 along a trajectory sampled from the target alone (what the engine verifies)."""
    gammas = np.empty(k)
    for j in range(k):
        gammas[j] = np.minimum(p[prev], q[prev]).sum()  # 1 − TV(p, q) at this prefix
        prev = rng.choice(len(p), p=p[prev])
    return float(expected_accept_length(gammas))


@pytest.mark.parametrize("seed,k", [(0, 3), (1, 5)])
def test_theorem3_estimator_is_unbiased(seed: int, k: int) -> None:
    p, q = markov_chain(seed)
    rng = np.random.default_rng(100 + seed)
    n = 6000
    actual = np.array([speculative_round(p, q, 0, k, rng) for _ in range(n)], dtype=float)
    estimate = np.array([estimator_on_target_rollout(p, q, 0, k, rng) for _ in range(n)])
    diff = actual.mean() - estimate.mean()
    se = np.sqrt(actual.var(ddof=1) / n + estimate.var(ddof=1) / n)
    assert abs(diff) <= 3 * se, f"MC accepted length {actual.mean():.4f} vs estimator {estimate.mean():.4f}"


def test_naive_realized_token_estimator_is_biased() -> None:
    """The check can fail: plugging in p(realised token) instead of 1 − TV is off by many SEs."""
    p, q = markov_chain(0)
    rng = np.random.default_rng(7)
    n, k = 6000, 3
    actual = np.array([speculative_round(p, q, 0, k, rng) for _ in range(n)], dtype=float)
    naive = []
    for _ in range(n):
        prev, gammas = 0, np.empty(k)
        for j in range(k):
            x = rng.choice(len(p), p=p[prev])
            gammas[j] = min(1.0, p[prev, x] / q[prev, x])
            prev = x
        naive.append(float(expected_accept_length(gammas)))
    naive_arr = np.array(naive)
    se = np.sqrt(actual.var(ddof=1) / n + naive_arr.var(ddof=1) / n)
    assert abs(actual.mean() - naive_arr.mean()) > 3 * se


def test_docstring_examples_of_the_learners_signals_and_simulator() -> None:
    import doctest
    import importlib

    names = ["draftwise.policies.feedback", "draftwise.policies.base", "draftwise.policies.ucb",
             "draftwise.policies.ucb_family",
             "draftwise.policies.exp3", "draftwise.policies.thompson", "draftwise.policies.halving",
             "draftwise.policies.hedge", "draftwise.policies.delayed", "draftwise.sim.process", "draftwise.cli.sim"]
    for name in names:
        result = doctest.testmod(importlib.import_module(name))
        assert result.failed == 0, name
        assert name.endswith(("thompson", "greedy")) or result.attempted > 0, name
