"""Learners on synthetic arms: concentration on the best arm, estimator properties, reproducibility.

Synthetic arms: each arm i drafts L = 4 tokens; position j's acceptance probability γ is drawn
from Beta(κα_i, κ(1−α_i)) (κ = 4) and the token is accepted with probability γ, so the accepted
length is truncated-geometric with per-token rate α_i. Every signal (BD, BE, length, blend,
throughput) and the counterfactual of every arm come out of one round record.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from draftwise.errors import DraftwiseError
from draftwise.policies import POLICIES, make_policy, policy_options
from draftwise.policies.exp3 import exp3_probs, exp3spec_loss, importance_weighted
from draftwise.policies.halving import halving_phases
from draftwise.trace import RoundRecord

ALPHAS = np.array([0.85, 0.6, 0.5, 0.35])  # arm 0 is best on every signal
ARMS = [f"d{i}" for i in range(len(ALPHAS))]
L = 4


def play_round(arm: int, index: int, position: int, rng: np.random.Generator, full: bool) -> RoundRecord:
    gammas = rng.beta(4 * ALPHAS, 4 * (1 - ALPHAS), size=(L + 1, len(ALPHAS)))  # (L+1, arms)
    accepted = 0
    while accepted < L and rng.random() < gammas[accepted, arm]:
        accepted += 1
    emitted = accepted + 1
    return RoundRecord(
        index=index, arm=arm, arm_name=ARMS[arm], max_draft=L, drafted=L, accepted=accepted,
        emitted=emitted, position=position, accept_probs=gammas[:L, arm].tolist(),
        counterfactual=gammas[:emitted].T.tolist() if full else None,
        draft_s=0.001 * L, verify_s=0.01,
    )


def run(spec: str, rounds: int, seed: int = 0) -> list[int]:
    """Play ``rounds`` rounds of one long query; returns the arms played."""
    policy = make_policy(spec, ARMS, np.random.default_rng(seed))
    env = np.random.default_rng(1000 + seed)
    policy.begin_query()
    played, position = [], 0
    for index in range(rounds):
        arm = policy.select()
        record = play_round(arm, index, position, env, policy.full_information)
        policy.update(arm, record)
        played.append(arm)
        position += record.emitted
    return played


# (spec, rounds, minimum share of the best arm over all rounds) — thresholds sit below what the
# learners reach on seeds 0–2, well above the 25% of uniform play.
CONCENTRATION = [
    ("ucb", 400, 0.90),
    ("ucb:reward=be", 400, 0.90),
    ("ucb1", 1500, 0.75),
    ("ucbspec", 3000, 0.85),
    ("ucb-tuned", 1500, 0.75),
    ("ducb", 600, 0.90),
    ("swucb", 600, 0.90),
    ("exp3", 1500, 0.60),  # γ = 0.4 caps the best arm at 1 − γ + γ/K = 0.7,
    ("exp3spec", 3000, 0.85),
    ("ts-beta", 800, 0.88),
    ("ts-gaussian", 800, 0.85),
    ("halving:period=20", 400, 0.78),
    ("petc", 400, 0.85),
    ("egreedy", 800, 0.85),
    ("hedge", 300, 0.90),
    ("normalhedge", 200, 0.90),
    ("normalhedge:game=chunk", 200, 0.90),
    ("normalhedge:loss=hybrid", 200, 0.90),
    ("adanormalhedge", 300, 0.90),
    ("hierarchical:outer=ucb,inner=ucb", 400, 0.90),  # one arm per drafter here: the outer learner decides
    ("ctx-ucb", 800, 0.80),  # no context here (none set): plain UCB with a bonus in units of the mean reward
]


@pytest.mark.parametrize("spec,rounds,threshold", CONCENTRATION)
def test_learner_concentrates_on_the_best_arm(spec: str, rounds: int, threshold: float) -> None:
    for seed in (0, 1):
        played = run(spec, rounds, seed)
        share = played.count(0) / rounds
        assert share >= threshold, f"{spec} seed {seed}: best arm {share:.2f} of pulls < {threshold}"


def test_every_registered_learner_has_a_concentration_check() -> None:
    checked = {spec.split(":")[0] for spec, _, _ in CONCENTRATION}
    baselines = {"fixed", "random", "round-robin"}
    assert set(POLICIES) - baselines <= checked


@pytest.mark.parametrize("name", sorted(set(POLICIES) - {"fixed"}))
def test_seeded_runs_are_reproducible(name: str) -> None:
    assert run(name, 120, seed=7) == run(name, 120, seed=7)


def test_random_seeds_differ() -> None:
    assert run("exp3", 200, seed=1) != run("exp3", 200, seed=2)


# -- EXP3 / EXP3Spec ----------------------------------------------------------------------------
def test_exp3_probs_form_a_distribution_with_gamma_floor() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = exp3_probs(rng.normal(0, 30, size=6), 0.4)
        assert p.sum() == pytest.approx(1.0, abs=1e-12)
        assert (p >= 0.4 / 6 - 1e-15).all()


@pytest.mark.parametrize("spec", ["exp3", "exp3spec"])
def test_exp3_family_probabilities_stay_a_distribution(spec: str) -> None:
    policy = make_policy(spec, ARMS, np.random.default_rng(3))
    env = np.random.default_rng(4)
    policy.begin_query()
    for index in range(300):
        arm = policy.select()
        policy.update(arm, play_round(arm, index, 0, env, False))
        p = policy.probs()
        assert p.sum() == pytest.approx(1.0, abs=1e-9) and (p >= 0).all()


def test_importance_weighted_estimators_are_unbiased() -> None:
    """Monte Carlo: E[x̂_j] over arm ~ p equals x_j, for EXP3's reward and EXP3Spec's loss."""
    rng = np.random.default_rng(11)
    p = np.array([0.5, 0.3, 0.15, 0.05])
    rewards = np.array([0.9, 0.4, 0.7, 0.2])
    lengths = np.array([4.0, 2.0, 1.0, 5.0])
    n = 200_000
    arms = rng.choice(4, size=n, p=p)
    for values in (rewards, np.array([exp3spec_loss(y, L) for y in lengths])):
        total = np.zeros(4)
        for arm in range(4):
            total += (arms == arm).sum() * importance_weighted(values[arm], arm, p)
        estimate = total / n
        # standard error of x̂_j: x_j sqrt((1 − p_j)/(p_j n))
        se = values * np.sqrt((1 - p) / (p * n))
        assert np.all(np.abs(estimate - values) <= 4 * se), (estimate, values)


def test_exp3spec_loss_range() -> None:
    assert exp3spec_loss(1, 4) == 1.0 and exp3spec_loss(5, 4) == 0.0


# -- options, across-query state, warm starts ----------------------------------------------------
def test_unknown_option_is_a_clear_error() -> None:
    with pytest.raises(DraftwiseError, match="valid options"):
        make_policy("ucb:betta=1", ARMS, np.random.default_rng(0))
    with pytest.raises(DraftwiseError, match="valid"):
        make_policy("normalhedge:game=sentence", ARMS, np.random.default_rng(0))


def test_policy_options_list_defaults_from_the_papers() -> None:
    assert policy_options("ucb")["beta"] == 0.01 and policy_options("ucb")["reward"] == "bd"
    assert policy_options("ucb1")["beta"] == 1.0
    assert policy_options("exp3")["gamma"] == 0.4
    assert policy_options("ucbspec")["reward"] == "length"
    assert policy_options("ucb-tuned")["reward"] == "blend"
    assert policy_options("normalhedge")["loss"] == "length"
    assert {"keep", "decay", "prior", "prior_weight"} <= set(policy_options("normalhedge"))


def test_reset_per_query_by_default_and_keep_with_decay() -> None:
    env = np.random.default_rng(0)
    fresh = make_policy("ucb", ARMS, np.random.default_rng(0))
    kept = make_policy("ucb:keep=true,decay=0.5", ARMS, np.random.default_rng(0))
    for policy in (fresh, kept):
        policy.begin_query()
        for index in range(40):
            arm = policy.select()
            policy.update(arm, play_round(arm, index, 0, env, False))
        policy.begin_query()
    assert fresh.pulls.sum() == 0
    assert kept.pulls.sum() == pytest.approx(20.0)  # 40 pulls shrunk by 0.5
    # the kept learner starts the new query on the best arm instead of re-trying every arm
    assert kept.select() == 0


def test_full_information_keep_with_decay_shrinks_regrets() -> None:
    policy = make_policy("normalhedge:keep=true,decay=0.25", ARMS, np.random.default_rng(0))
    env = np.random.default_rng(0)
    policy.begin_query()
    for index in range(30):
        arm = policy.select()
        policy.update(arm, play_round(arm, index, 0, env, True))
    policy.select()  # drain the queue
    before = policy.learner.regrets.copy()
    policy.begin_query()
    assert np.allclose(policy.learner.regrets, 0.25 * before)
    assert policy.probs().argmax() == 0


@pytest.mark.parametrize("spec", ["ucb", "ucbspec", "ucb-tuned", "ts-gaussian", "egreedy"])
def test_warm_start_prior_picks_the_prior_best_arm_first(spec: str) -> None:
    policy = make_policy(f"{spec}:prior=d2=0.9/d0=0.1/d1=0.1/d3=0.1,prior_weight=50", ARMS, np.random.default_rng(0))
    policy.begin_query()
    if spec == "egreedy":
        policy.epsilon = 0.0
    if spec == "ucbspec":  # prior in length units: d2 looks like 0.9·... the biggest mean anyway
        policy.max_draft = L
    assert policy.select() == 2


@pytest.mark.parametrize("spec", ["hedge", "normalhedge", "adanormalhedge", "exp3", "ts-beta"])
def test_warm_start_prior_shifts_the_distribution(spec: str) -> None:
    counts = np.zeros(4)
    policy = make_policy(f"{spec}:prior=0.05/0.05/0.85/0.05,prior_weight=20", ARMS, np.random.default_rng(0))
    for _ in range(200):
        policy.begin_query()
        counts[policy.select()] += 1
    assert counts.argmax() == 2 and counts[2] >= 120


def test_bad_prior_is_a_clear_error() -> None:
    with pytest.raises(DraftwiseError, match="4 arms"):
        make_policy("ucb:prior=0.1/0.2", ARMS, np.random.default_rng(0))
    with pytest.raises(DraftwiseError, match="unknown arms"):
        make_policy("ucb:prior=zz=0.1", ARMS, np.random.default_rng(0))


def test_full_information_policy_refuses_records_without_counterfactual() -> None:
    policy = make_policy("normalhedge", ARMS, np.random.default_rng(0))
    policy.begin_query()
    with pytest.raises(DraftwiseError, match="full-information"):
        policy.update(0, play_round(0, 0, 0, np.random.default_rng(0), full=False))


def test_update_returns_the_reward_or_loss_used() -> None:
    record = play_round(0, 0, 0, np.random.default_rng(5), full=True)
    ucb = make_policy("ucb:reward=be", ARMS, np.random.default_rng(0))
    assert ucb.update(0, record) == record.accepted / L
    hedge = make_policy("normalhedge:loss=accept", ARMS, np.random.default_rng(0))
    loss = hedge.update(0, record)
    assert loss == pytest.approx(1 - np.mean(record.counterfactual[0]))


# -- halving -------------------------------------------------------------------------------------
def test_halving_phases_end_with_one_survivor() -> None:
    for k in range(1, 40):
        survivors, phases = k, 0
        while survivors > 1:
            survivors = math.ceil(survivors / 2)
            phases += 1
        assert phases == halving_phases(k)


def test_halving_commits_after_k_log_k_pulls() -> None:
    played = run("halving", 60)
    assert len(set(played[10:])) == 1  # 4 + 2 pulls with period 1, then one arm for good


def test_ucbspec_radius_matches_banditspec_formula() -> None:
    from draftwise.policies.ucb_family import ucbspec_radius

    rng = np.random.default_rng(0)
    for _ in range(20):
        pulls = rng.integers(1, 50, size=5).astype(float)
        t, L, delta = float(pulls.sum()), int(rng.integers(1, 9)), float(rng.uniform(0.05, 1.0))
        literal = (L / 2) * np.sqrt((1 + pulls) / pulls**2 * (1 + 2 * np.log(5 * t**2 * np.sqrt(1 + pulls) / delta)))
        assert ucbspec_radius(pulls, t, 5, L, delta) == pytest.approx(literal, rel=1e-12)
    assert np.isinf(ucbspec_radius(np.array([0.0, 2.0]), 2, 2, 4, 0.5)[0])


def test_ucbspec_plays_the_largest_mean_plus_its_published_radius() -> None:
    from draftwise.policies.ucb_family import ucbspec_radius

    rng = np.random.default_rng(3)
    policy = make_policy("ucbspec:max_draft=4", ["a", "b", "c"], np.random.default_rng(0))
    for _ in range(200):
        arm = policy.select()
        policy.observe(arm, float(rng.normal([1.0, 1.6, 1.4][arm], 0.5)))
        want = policy.means() + ucbspec_radius(policy.pulls, policy.t, 3, 4, policy.delta)
        assert policy.select() == int(np.argmax(want))


def test_ucbspec_measured_scale_follows_the_rewards_spread() -> None:
    """``scale=std``: the radius's constant is L/2 while little is seen, then shrinks towards the
    rewards' own standard deviation within arms (the L/2 prior fades as 1/√n when the spread is
    small) — a steady reward (a batch's mean over its rows) soon commits."""
    rng = np.random.default_rng(1)
    policy = make_policy("ucbspec:max_draft=4,scale=std", ["a", "b"], np.random.default_rng(0))
    assert policy.radius_scale() == pytest.approx(2.0)
    for _ in range(400):
        arm = policy.select()
        policy.observe(arm, float(rng.normal([1.0, 1.1][arm], 0.05)))
    assert 0.05 < policy.radius_scale() < 0.2  # (2 · 2² + 400 · 0.05²) / 402, square-rooted: ≈ 0.15
    assert policy.pulls[1] > 0.9 * policy.pulls.sum()
    paper = make_policy("ucbspec:max_draft=4", ["a", "b"], np.random.default_rng(0))
    assert paper.radius_scale() == 2.0
    with pytest.raises(DraftwiseError, match="scale"):
        make_policy("ucbspec:scale=wide", ["a", "b"], np.random.default_rng(0))


def test_ucbspec_discount_re_tries_an_arm_that_turned_good() -> None:
    """``gamma`` < 1: the evidence fades every round played, so an arm abandoned while it was poor is
    tried again and played once it is the better one; without the discount it is not (the
    undiscounted learner's 200 early rounds outweigh the change)."""
    def late_plays(spec: str) -> int:
        rng = np.random.default_rng(5)
        policy = make_policy(spec, ["none", "draft"], np.random.default_rng(0))
        played = []
        for t in range(600):
            arm = policy.select()
            means = [1.0, 0.7 if t < 200 else 1.3]  # drafting pays only after the answer's opening
            policy.observe(arm, float(rng.normal(means[arm], 0.05)))
            played.append(arm)
        return sum(played[400:])

    assert late_plays("ucbspec:max_draft=1,scale=std,gamma=0.98") > 150
    assert late_plays("ucbspec:max_draft=1,scale=std") < 50
    discounted = make_policy("ucbspec:gamma=0.5", ["a", "b"], np.random.default_rng(0))
    discounted.observe(0, 1.0)
    discounted.observe(0, 1.0)
    assert discounted.pulls[0] == pytest.approx(1.5) and discounted.t == pytest.approx(1.5)
    with pytest.raises(DraftwiseError, match="gamma"):
        make_policy("ucbspec:gamma=0", ["a", "b"], np.random.default_rng(0))
