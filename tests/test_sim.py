"""The simulator: calibration against the papers' tables, engine-equivalent feedback, CLI, determinism."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from draftwise.cli import main
from draftwise.cli.sim import split_policies
from draftwise.errors import DraftwiseError
from draftwise.policies.base import Policy
from draftwise.sim import SCENARIOS, get_scenario, simulate
from draftwise.sim.process import (
    acceptance_from_mat,
    draw_gammas,
    fixed_arm_rounds,
    mat_from_acceptance,
    next_failure,
    response_lengths,
)
from draftwise.sim.runner import draw_queries, fixed_rounds, run_query
from draftwise.sim.scenarios import LLAMA_MAT, METASD_SPEEDUP, metasd_draft_cost
from draftwise.trace import RoundRecord


def test_mat_conversion_round_trips() -> None:
    for chunk in (2, 6, 9):
        for m in np.linspace(1.0, chunk - 0.05, 13):
            assert mat_from_acceptance(acceptance_from_mat(m, chunk), chunk) == pytest.approx(m, abs=1e-9)
    with pytest.raises(DraftwiseError, match="impossible"):
        acceptance_from_mat(9.5, 9)


def test_fixed_drafter_mat_matches_the_papers_table() -> None:
    """Simulated MAT of each (drafter, domain) of HedgeSpec Table 1 within 3% of the published one."""
    scenario = get_scenario("hedgespec-llama")
    rng = np.random.default_rng(0)
    B = 20_000
    for arm, domain in [(0, 0), (0, 2), (5, 5), (6, 6), (3, 1)]:
        alpha = np.full((B + 9, 1), scenario.alpha[arm, domain])
        gammas = draw_gammas(alpha, scenario.kappa, 0.0, rng)
        failure = next_failure(rng.random((B + 9, 1)) < gammas)
        mat = B / fixed_arm_rounds(failure[:, 0], B, scenario.max_draft)
        assert mat == pytest.approx(LLAMA_MAT[arm, domain], rel=0.03)


def test_markov_correlation_keeps_the_mean_but_lengthens_runs() -> None:
    rng = np.random.default_rng(1)
    alpha = np.full((50_000, 1), 0.6)
    iid, sticky = draw_gammas(alpha, 2.0, 0.0, rng), draw_gammas(alpha, 2.0, 0.9, rng)
    assert iid.mean() == pytest.approx(0.6, abs=0.01) and sticky.mean() == pytest.approx(0.6, abs=0.03)
    lag1 = lambda g: np.corrcoef(g[:-1, 0], g[1:, 0])[0, 1]
    assert abs(lag1(iid)) < 0.02 and lag1(sticky) > 0.8


def test_response_lengths_are_lognormal_and_capped() -> None:
    lengths = response_lengths(20_000, 300, 0.7, 1024, 16, np.random.default_rng(0))
    assert np.median(lengths) == pytest.approx(300, rel=0.03)
    assert lengths.max() == 1024 and lengths.min() >= 16


def test_metasd_calibration_reproduces_table9_speedups() -> None:
    """Simulated speedup of each fixed Table 9 drafter on its diagonal within 3% of the paper's."""
    scenario = get_scenario("metasd-multilingual")
    c = metasd_draft_cost()
    assert 0.02 < c < 0.04
    rng = np.random.default_rng(2)
    B = 20_000
    for d in range(5):
        alpha = np.full((B + 6, 1), scenario.alpha[d, d])
        failure = next_failure(rng.random((B + 6, 1)) < draw_gammas(alpha, scenario.kappa, 0.0, rng))
        rounds = fixed_arm_rounds(failure[:, 0], B, 5)
        speedup = B / (rounds * (1 + 5 * c))
        assert speedup == pytest.approx(METASD_SPEEDUP[d, d], rel=0.03)


def test_switching_query_changes_domain_mid_response() -> None:
    scenario = get_scenario("metasd-nonstationary")
    query = draw_queries(scenario, 0, 1, tokens=200, median=None)[0]
    assert set(query.domain[:100]) == {3} and set(query.domain[100:200]) == {4}


class Recorder(Policy):
    """Plays a scripted arm sequence and keeps the records it is given."""

    full_information = True

    def reset(self) -> None:
        self.records: list[RoundRecord] = []

    def select(self) -> int:
        return len(self.records) % self.n_arms

    def update(self, arm: int, record: RoundRecord) -> float | None:
        self.records.append(record)
        return None

    def observe(self, arm: int, reward: float) -> None:
        pass


def test_records_carry_exactly_the_engine_feedback() -> None:
    """Counterfactual = γ of every arm at the verified positions only (censoring), tokens add up."""
    scenario = get_scenario("scaling-4")
    query = draw_queries(scenario, 3, 1, tokens=300, median=None)[0]
    policy = Recorder(list(scenario.arms), np.random.default_rng(0))
    result = run_query(policy, scenario, query)
    assert sum(r.emitted for r in policy.records) == 300 == result.tokens
    for r in policy.records:
        cf = np.array(r.counterfactual)
        assert cf.shape == (4, r.emitted)
        assert np.allclose(cf, query.gammas[r.position : r.position + r.emitted].T)
        assert np.allclose(r.accept_probs, query.gammas[r.position : r.position + r.max_draft, r.arm])
        accepted = slice(r.position, r.position + r.accepted)
        ok = query.uniforms[accepted] < query.gammas[accepted, r.arm]
        assert ok.all()
        if r.accepted < r.max_draft and r.position + r.emitted < 300:
            assert query.uniforms[r.position + r.accepted] >= query.gammas[r.position + r.accepted, r.arm]


def test_fixed_policy_matches_fixed_rounds() -> None:
    scenario = get_scenario("hedgespec-llama")
    from draftwise.policies import make_policy

    for query in draw_queries(scenario, 5, 3, tokens=None, median=None):
        rounds = fixed_rounds(scenario, query)
        for arm in (0, 4):
            policy = make_policy(f"fixed:{arm}", list(scenario.arms), np.random.default_rng(0))
            result = run_query(policy, scenario, query)
            assert result.rounds == rounds[arm]


def test_simulate_is_bit_for_bit_reproducible_and_order_independent() -> None:
    scenario = get_scenario("scaling-4")
    a = simulate(scenario, ["exp3spec", "normalhedge"], seeds=2, queries=4)
    b = simulate(scenario, ["normalhedge", "exp3spec"], seeds=2, queries=4)
    assert a["policies"]["normalhedge"] == b["policies"]["normalhedge"]
    assert a["policies"]["exp3spec"] == b["policies"]["exp3spec"]
    c = simulate(scenario, ["exp3spec"], seeds=2, queries=4, first_seed=5)
    assert c["policies"]["exp3spec"] != a["policies"]["exp3spec"]


def test_oracle_beats_random_and_normalhedge_is_near_it() -> None:
    res = simulate(get_scenario("hedgespec-llama"), ["random", "normalhedge"], seeds=1, queries=14)
    oracle = res["oracle"]["mat"]
    assert res["policies"]["random"]["mat"] < 0.7 * oracle
    assert res["policies"]["normalhedge"]["mat"] > 0.9 * oracle
    assert res["policies"]["random"]["regret"] > 10 * max(res["policies"]["normalhedge"]["regret"], 0.5)


def test_every_scenario_builds_and_runs() -> None:
    assert {"hedgespec-llama", "hedgespec-qwen", "metasd-multilingual", "metasd-nonstationary"} <= set(SCENARIOS)
    assert {f"scaling-{n}" for n in (2, 4, 8, 16, 32, 64)} <= set(SCENARIOS)
    for name in SCENARIOS:
        scenario = get_scenario(name)
        assert scenario.alpha.shape == (len(scenario.arms), len(scenario.domains))
        assert ((scenario.alpha > 0) & (scenario.alpha < 1)).all()
        simulate(scenario, ["ucb"], seeds=1, queries=2, tokens=40)


def test_split_policies() -> None:
    assert split_policies("a,b:x=1,y=2,c") == ["a", "b:x=1,y=2", "c"]
    with pytest.raises(DraftwiseError):
        split_policies("x=1,a")


def test_cli_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["sim", "--scenario", "scaling-2", "--policies", "ucbspec,normalhedge:game=chunk",
                 "--seeds", "2", "--queries", "3", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"] == "scaling-2" and out["seeds"] == 2
    assert isinstance(out["oracle"]["mat"], float)
    assert set(out["policies"]) == {"ucbspec", "normalhedge:game=chunk"}
    for metrics in out["policies"].values():
        for key in ("mat", "mat_std", "regret", "best_arm_ratio", "speedup"):
            assert isinstance(metrics[key], float)


def test_cli_table_list_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--list"]) == 0
    assert "hedgespec-llama" in capsys.readouterr().out
    assert main(["sim", "--scenario", "scaling-2", "--seeds", "1", "--queries", "2"]) == 0
    assert "oracle" in capsys.readouterr().out
    assert main(["sim", "--scenario", "nope"]) == 2
    assert "valid:" in capsys.readouterr().err
    assert main(["sim", "--scenario", "scaling-2", "--policies", "ucb:nope=1"]) == 2
    assert main(["sim", "--scenario", "scaling-2", "--seeds", "1", "--queries", "2",
                 "--rho", "0.5", "--kappa", "4"]) == 0
    assert main(["sim", "--scenario", "scaling-2", "--rho", "1.5"]) == 2
    assert main(["policies"]) == 0
    listing = capsys.readouterr().out
    assert "normalhedge:" in listing and "gamma=0.4" in listing


def test_sim_imports_no_torch() -> None:
    code = "import sys, draftwise.cli, draftwise.cli.sim, draftwise.sim.runner; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
