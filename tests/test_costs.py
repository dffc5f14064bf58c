"""The machine's cost model: the target's forwards measured at first load, kept per machine and
target, refined by timed rounds, shown by ``draftwise costs`` and in the statistics; ``auto`` numerics
chosen by measuring the modes that keep the checkpoint's precision."""

from __future__ import annotations

import doctest
import json

import pytest
import torch

import draftwise.models.costs as costs
from draftwise import Generator
from draftwise.cli import main
from draftwise.models.costs import CostCurve, fastest_keeping, machine, target_costs
from draftwise.models.loading import LoadOptions, load_target
from draftwise.models.numerics_modes import KEEPING


@pytest.fixture()
def home(tmp_path, monkeypatch):
    """An empty draftwise home, and no curve remembered by this process."""
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path))
    monkeypatch.setattr(costs, "_loaded", {})
    return tmp_path


@pytest.fixture(scope="module")
def zoo_target():
    model, _, _ = load_target("zoo:target", LoadOptions(numerics="int4"))
    return model


def test_docstring_examples_of_the_cost_model() -> None:
    result = doctest.testmod(costs)
    assert result.failed == 0 and result.attempted > 0


def test_the_curve_is_measured_once_and_kept_per_machine(home, zoo_target, monkeypatch) -> None:
    curve = target_costs(zoo_target)
    assert set(curve.tokens_s) == set(costs.TOKENS) and set(curve.rows_s) == set(costs.ROWS)
    assert all(s > 0 for s in [*curve.tokens_s.values(), *curve.rows_s.values()])
    assert curve.key["numerics"] == "int4" and curve.key["threads"] == torch.get_num_threads()
    assert 0 < curve.measure_s <= costs.BUDGET_S + 2  # each point is timed once at least, then turns till the budget
    kept = list((home / "costs").glob("*.json"))
    assert len(kept) == 1

    monkeypatch.setattr(costs, "_loaded", {})  # a new process reads the kept curve: nothing is measured
    monkeypatch.setattr(costs, "measure", lambda *a, **k: pytest.fail("measured again"))
    again = target_costs(zoo_target)
    assert again.tokens_s == curve.tokens_s and again.key == curve.key

    monkeypatch.setattr(costs, "machine", lambda: {**machine(), "cpu": "another CPU"})
    monkeypatch.setattr(costs, "measure", lambda model, key, budget: CostCurve(key, {1: 1.0}, {1: 1.0}))
    assert target_costs(zoo_target).key["cpu"] == "another CPU"  # another machine measures its own
    assert len(list((home / "costs").glob("*.json"))) == 2

    monkeypatch.setattr(costs, "forward_code", lambda: "another forward")
    assert target_costs(zoo_target).key["forward"] == "another forward"  # so does another release's forward
    assert len(list((home / "costs").glob("*.json"))) == 3


def test_a_damaged_kept_curve_is_measured_again(home, zoo_target) -> None:
    curve = target_costs(zoo_target)
    path = costs.curve_path(curve.key)
    path.write_text("{not json")
    costs._loaded.clear()
    assert target_costs(zoo_target).key == curve.key
    assert json.loads(path.read_text())["key"] == curve.key


def test_the_curve_interpolates_and_follows_timed_forwards() -> None:
    curve = CostCurve({}, {1: 0.010, 2: 0.012, 4: 0.016, 8: 0.030}, {1: 0.010, 4: 0.016, 16: 0.050})
    assert curve.forward_s(3) == pytest.approx(0.014) and curve.relative(8) == pytest.approx(3.0)
    assert curve.forward_s(12) == pytest.approx(0.044)  # past the last point: along the last two
    assert curve.step_s(8) == pytest.approx(0.016 + 4 * (0.050 - 0.016) / 12)
    for _ in range(200):  # this machine's 4-token forwards turn out 1.5× the measured curve
        curve.observe(4, 0.024)
    assert curve.forward_s(4) == pytest.approx(0.024, rel=0.01)
    assert curve.forward_s(1) == pytest.approx(0.010)  # other points keep their own measurement
    curve.observe(1, 10.0)  # a stall (1000× the curve) is no cost
    assert curve.forward_s(1) == pytest.approx(0.010)
    a, b, c, p = curve.step_prior()
    assert a > 0 and b > 0 and c > 0 and p == c


def test_a_generator_prices_on_the_curve_and_reports_it(home) -> None:
    gen = Generator.from_pretrained("zoo:target", ["pld"], policy="fixed:pld", numerics="float32")
    assert gen.costs.key["numerics"] == "float32"
    assert gen.step_costs.prior_mean == pytest.approx(gen.costs.step_prior())
    before = dict(gen.costs.scale)
    gen.generate("def fib(n): return fib(n - 1) + fib(n - 2)  # def fib(n):", max_new_tokens=48, ignore_eos=True)
    assert gen.costs.scale != before  # the rounds it timed refined the curve


def test_draftwise_costs_prints_the_curve(home, capsys) -> None:
    assert main(["costs", "--target", "zoo:target", "--numerics", "int4"]) == 0
    out = capsys.readouterr().out
    assert "int4" in out and "x plain step" in out and "ms per row" in out and str(home) in out
    assert main(["costs", "--target", "zoo:target", "--numerics", "int4", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["machine"]["numerics"] == "int4" and summary["relative"]["1"] == 1.0


def test_generate_json_shows_the_costs(home, capsys) -> None:
    assert main(["generate", "--target", "zoo:target", "--json", "--max-new-tokens", "4", "def f():"]) == 0
    stats = json.loads(capsys.readouterr().out)["stats"]
    assert set(stats["costs"]) >= {"machine", "forward_ms", "relative", "batch_step_ms"}


def test_auto_keeps_the_checkpoint_s_own_mode_unless_another_is_much_faster(home, zoo_target, monkeypatch) -> None:
    assert fastest_keeping(zoo_target, "float32") == "float32"  # nothing else keeps float32 weights
    timings = {"bfloat16": 1.0, "float32": 0.9}
    monkeypatch.setattr(costs, "product_seconds", lambda modes, shapes, budget: {m: timings[m] for m in modes})
    assert fastest_keeping(zoo_target, "bfloat16") == "bfloat16"  # within the margin: its own
    assert KEEPING["bfloat16"] == ("bfloat16", "float32")
    timings["bfloat16"] = 9.0  # bfloat16 products without bfloat16 instructions
    assert fastest_keeping(zoo_target, "bfloat16") == "bfloat16"  # kept from the first measurement
    for kept in (home / "costs").glob("modes-*.json"):
        kept.unlink()
    assert fastest_keeping(zoo_target, "bfloat16") == "float32"
