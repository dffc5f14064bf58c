"""A drafter kind written outside the package (examples/bigram_drafter.py), registered through the
public registry, works with a bandit policy, a routed arm and the evaluation phase, losslessly."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from draftwise import Generator
from draftwise.drafters import DRAFTERS

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "bigram_drafter.py"
PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 10, 11, 5, 6, 7]


@pytest.fixture(scope="module")
def bigram_registered():
    if "bigram" not in DRAFTERS:
        spec = importlib.util.spec_from_file_location("bigram_drafter", EXAMPLE)
        module = importlib.util.module_from_spec(spec)
        sys.modules["bigram_drafter"] = module
        spec.loader.exec_module(module)
    return "bigram"


@pytest.mark.parametrize("policy,arms", [
    ("ucb", None),  # a bandit over one arm per drafter
    ("ucb", "auto@4,pld@4,none"),  # the routed arm picks between the bigram and the LM drafter
    ("hedgespec", None),  # full information: every drafter scored on the verified tokens
])
def test_a_drafter_kind_from_outside_the_package_is_lossless(tiny_models, tiny_tokenizer, bigram_registered,
                                                             policy, arms) -> None:
    target = str(tiny_models["llama-target"])
    pool = [f"bigram:vocab={len(tiny_tokenizer)}", str(tiny_models["llama-near"]), "pld"]
    gen = Generator.from_pretrained(target, drafters=pool, policy=policy, arms=arms)
    reference = Generator.from_pretrained(target, policy="fixed:none").generate(PROMPT, max_new_tokens=40,
                                                                             ignore_eos=True).token_ids
    result = gen.generate(PROMPT, max_new_tokens=40, ignore_eos=True)
    assert result.token_ids == reference
    if policy == "hedgespec":  # the bigram's counterfactual acceptance was computed from its logits
        scored = [r.counterfactual[0] for r in result.trace if r.counterfactual is not None]
        assert scored and any(v > 0 for row in scored for v in row)
    if arms:  # the routed arm scored both model drafters on the prompt and picked one
        assert gen.engine.last_query.arm_drafter[0] in (0, 1)
    if policy == "ucb" and arms is None:  # the bandit played the new drafter's own arm
        assert result.stats.pulls.get("bigram", 0) > 0


def test_bigram_sampling_runs_and_is_reproducible(tiny_models, tiny_tokenizer, bigram_registered) -> None:
    target = str(tiny_models["llama-target"])
    pool = [f"bigram:vocab={len(tiny_tokenizer)}", "pld"]
    runs = [Generator.from_pretrained(target, drafters=pool, policy="hedgespec").generate(
        PROMPT, max_new_tokens=30, temperature=0.9, seed=5, ignore_eos=True).token_ids for _ in range(2)]
    assert runs[0] == runs[1]
