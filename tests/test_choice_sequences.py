"""The arms each driver plays — the single-query engine, the batched engine (per-query and batch-level
decisions) and the vLLM proposer's core — for fixed seeds and inputs, with timing taken out: rewards
that count tokens (``length``, ``be``) instead of seconds, a step-cost model with fixed coefficients,
a model drafter's cost per token fixed, lookup drafts unpriced (the vLLM proposer's admission by predicted
acceptance off but in one case, ``admitted``), and the vLLM proposer on its fake clock.

The sequences below are the reference behaviour of the three drivers, which all decide through
:mod:`draftwise.decision.core`: a change to what any of them decides shows here first.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from typing import Any

import numpy as np
import pytest
from test_vllm_logic import FACTS, Clock, serve

from draftwise import Generator
from draftwise.decision.step_costs import StepCostModel, StepShape
from draftwise.drafters import build_drafters
from draftwise.models.loading import LoadOptions, load_causal_lm
from draftwise.vllm.core import ProposerCore
from draftwise.vllm.options import ProposerOptions

PROMPTS = [[5, 9, 13, 7, 11, 3] * 3 + [5, 9], [12, 4, 30, 22, 4, 30, 22, 6], list(range(2, 20)),
           [7, 8, 7, 8, 7, 8, 9, 10, 7, 8, 7]]


class FixedCosts(StepCostModel):
    """A step-cost model that has measured every step already: its coefficients never move, and a
    model drafter's token always costs ``token_s``."""

    def __init__(self, coef: tuple[float, float, float, float], token_s: float) -> None:
        super().__init__()
        self.coef, self.draft_cost_known = coef, True
        self.model_token_s = _Constant(token_s)

    def observe(self, shape: StepShape) -> bool:
        return True


class _Constant(deque):
    def __init__(self, value: float) -> None:
        super().__init__(maxlen=32)
        self.value = value

    def append(self, _: Any) -> None:
        super().append(self.value)


def _generator(tiny_models, policy: str, **kwargs: Any) -> Generator:
    options = LoadOptions()
    model, tokenizer = load_causal_lm(str(tiny_models["llama-target"]), options)
    specs = ["pld", "suffix", str(tiny_models["llama-small"]), str(tiny_models["llama-twin"])]
    gen = Generator(model, tokenizer, build_drafters(specs, model, tokenizer, options), policy=policy, **kwargs)
    gen.engine.pricing = None  # priced drafts rest on measured times (their own tests: test_pricing.py)
    return gen


def _arms(trace: list[Any], names: list[str]) -> str:
    """A query's arms, one character each (the arm's index; a routed arm's drafter left out)."""
    return "".join(str(names.index(r.arm_name.split("=")[0])) for r in trace)


# -- the single-query engine -------------------------------------------------------------------------------
SINGLE = {
    "ctx-ucb:reward=length": ["04441410411001320002", "33322322222202", "203220020000223", "3222332222222",
        "2222222222"],
    "ctx-ucb:reward=length,fallback=model,opening=4": ["04441202001220000100", "2202322020222", "113222222222",
        "0333222222222", "02222222222"],
    "ucb:reward=length,keep=true": ["42103333333", "332222222222", "33333333", "3333222222222", "2222222222"],
    "round-robin": ["0123401234012340", "01234012340123401234012", "012340123401234012", "01234012340123401234",
        "012340123401234012"],
    "hedgespec": ["233333333", "233333333", "233333333", "233333333", "033333333"],
}


@pytest.mark.parametrize("policy", list(SINGLE))
def test_the_single_query_engine_plays_the_reference_arms(tiny_models, policy) -> None:
    arms = "pld@4,suffix@8,llama-twin@3,auto@4,none" if policy != "hedgespec" else None
    gen = _generator(tiny_models, policy, **({"arms": arms} if arms else {}))
    names = [a.name for a in gen.arms]
    got = [_arms(gen.generate(p, max_new_tokens=40, ignore_eos=True).trace, names) for p in PROMPTS]
    got.append(_arms(gen.generate(PROMPTS[0], max_new_tokens=40, temperature=0.7, seed=3, ignore_eos=True).trace,
                     names))
    assert got == SINGLE[policy]


# -- the batched engine ------------------------------------------------------------------------------------
COEF = (8e-3, 5e-4, 1e-3, 0.0)  # the load cap: 8 / 6 / 5 tokens at 1 / 2 / 3 rows
MODEL_TOKEN_S = 2e-3  # a model draft pays 4 / 2 / 0 tokens at 1 / 2 / 3 rows: blocked at 3
BATCHED = {
    ("ctx-ucb:reward=length", "query"): ["044114100411000014141111", "444444114441114111010010011",
        "411141010141110111000", "011111000144110041000", "01111100000110", "132220011101010011", "1110101110102",
        "01100010010"],
    ("ucb:reward=be,keep=true", "query"): ["4120010000000000000000000", "23101001111111111111111111011",
        "40120110000000000000000000", "000000000000000000000000000000", "000000000000000000000000000000",
        "00000000000000000000000000000", "000222222222", "002222222222"],
    ("round-robin", "query"): ["014404304440444044404440444", "01302404440444044404440444044",
        "01440240444044404440444044404", "014404440444044404440444044404", "01440444044404440444044404440",
        "014404440444044404440444044404", "0130240240240240240", "01302402402402402402"],
    ("banditspec-length:reward=length", "batch"): ["01234444444444444444444", "0123444444444444444444444444",
        "01234444444444444444444444", "44444444444444444444444", "44444444444444444444444",
        "4444444444444444444444444444", "44444444444444444444444444", "44444444444444444444444",
        "012344444444444444444444444444444444444444444444444444444444444444444444"],
}


@pytest.mark.parametrize("policy, decide", list(BATCHED))
def test_the_batched_engine_plays_the_reference_arms(tiny_models, policy, decide) -> None:
    arms = None if decide == "batch" else "pld@4,suffix@8,llama-twin@3,auto@4,none"
    gen = _generator(tiny_models, policy, **({"arms": arms} if arms else {}))
    gen.step_costs = FixedCosts(COEF, MODEL_TOKEN_S)
    names = [a.name for a in gen.arms]
    session = gen.batch_session(3, decide=decide)
    handles = [session.add(p, max_new_tokens=30, ignore_eos=True, seed=i) for i, p in enumerate(PROMPTS * 2)]
    session.run()
    got = [_arms(h.result.trace, names) for h in handles]
    if decide == "batch":
        got.append("".join(str(r.arm) for r in session.engine.batch_records))
    assert got == BATCHED[(policy, decide)]


# -- the vLLM proposer -------------------------------------------------------------------------------------
PROPOSER = {  # options; the digest of every step's draft lengths and every request's pulls; pulls in all
    "default": (ProposerOptions(admit=False, log_requests=False),
                ["0e2a494f4c25f2af", [("none", 25), ("suffix@8", 106)]]),
    "lookups": (ProposerOptions(drafters=("pld", "suffix"), admit=False, log_requests=False, seed=2),
                ["8f1db88e38106d24", [("none", 2), ("pld@8", 434), ("suffix@8", 67)]]),
    "model": (ProposerOptions(drafters=("suffix", "zoo:generalist"), admit=False, log_requests=False),
              ["e6e71cf00563f036", [("generalist@4", 11), ("none", 260), ("suffix@8", 276)]]),
    "load-context": (ProposerOptions(drafters=("pld", "suffix"), load_context=True, admit=False,
                                    log_requests=False),
                     ["21fc798c2f679108", [("none", 127), ("pld@8", 334), ("suffix@8", 43)]]),
    "ucb": (ProposerOptions(policy="ucb:reward=throughput,keep=true", drafters=("pld", "suffix"), admit=False,
                           log_requests=False),
            ["017a1cdc3c430c26", [("none", 1), ("pld@8", 594), ("suffix@8", 3)]]),
    "admitted": (ProposerOptions(log_requests=False), ["635bd564b1d50d4e", [("none", 20), ("suffix@8", 121)]]),
    "batch": (ProposerOptions(mode="batch", batch_lengths=(0, 2, 4, 8), log_requests=False),
              ["e229027d66c894cc", [("len@0", 71), ("len@2", 38), ("len@4", 38), ("len@8", 421)]]),
}


@pytest.mark.parametrize("name", list(PROPOSER))
def test_the_vllm_proposer_plays_the_reference_arms(name) -> None:
    options, want = PROPOSER[name]
    clock = Clock()
    core = ProposerCore(options, FACTS, clock=clock)
    steps: list[list[int]] = []
    original = core.step

    def step(*args: Any) -> list[list[int]]:
        drafts = original(*args)
        steps.append([len(d) for d in drafts])
        return drafts

    core.step = step  # type: ignore[method-assign]
    for batch, first in ((1, 0), (4, 10), (16, 40)):
        serve(core, clock, batch=batch, n_req=batch + 2, new=40, first=first, shuffle=batch > 1)
    pulls = [sorted(line["pulls"].items()) for line in core.finished]
    digest = hashlib.sha256(json.dumps([steps, pulls]).encode()).hexdigest()[:16]
    total: dict[str, int] = {}
    for line in core.finished:
        for arm, n in line["pulls"].items():
            total[arm] = total.get(arm, 0) + n
    assert [digest, sorted(total.items())] == want


def test_the_reference_runs_see_no_clock() -> None:
    """The fixed costs above stand in for every measurement the drivers' decisions read."""
    costs = FixedCosts(COEF, MODEL_TOKEN_S)
    costs.model_token_s.append(5.0)
    assert costs.observe(StepShape(3, 9, 1.0)) and costs.coef == COEF and list(costs.model_token_s) == [MODEL_TOKEN_S]
    assert costs.cap(1, 8, 0.9) == 8 and costs.cap(3, 8, 0.9) == 5
    assert np.isclose(costs.coef[2], COEF[2])
