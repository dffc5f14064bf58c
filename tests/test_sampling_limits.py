"""Temperatures and top-p values too small for float arithmetic give the greedy text exactly, through the
library and the CLI (the server's answers: tests/test_serve.py)."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

from draftwise.cli import main
from draftwise.verify.chain import GREEDY_BELOW, Sampling, sampling_settings, warp

# 1e-45 is float32's smallest subnormal; math.ulp(0.0) the smallest positive double (5e-324)
VANISHING = [1e-300, 1e-45, 1e-30, math.ulp(0.0), sys.float_info.min]
PROMPT = "def square(x):"


@pytest.mark.parametrize("temperature", [*VANISHING, GREEDY_BELOW / 2])
def test_a_temperature_below_the_threshold_is_greedy(temperature):
    assert sampling_settings(temperature, top_k=5, top_p=0.5) == Sampling()
    assert not sampling_settings(GREEDY_BELOW, top_k=5).greedy


@pytest.mark.parametrize("top_p", VANISHING)
def test_a_vanishing_top_p_keeps_exactly_the_most_likely_token(top_p):
    logits = torch.tensor([[0.3, 2.0, -1.0, 1.9], [5.0, 0.0, 0.0, 0.0]])
    probs = warp(logits, Sampling(temperature=0.7, top_p=top_p))
    assert not probs.isnan().any()
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]


@pytest.fixture(scope="module")
def zoo():
    from draftwise import Generator

    generator = Generator.from_pretrained("zoo:target", drafters=["pld"])
    return generator, generator.generate(PROMPT, max_new_tokens=8).token_ids


@pytest.mark.parametrize("value", VANISHING)
def test_the_api_answers_greedy_text_at_a_vanishing_temperature_or_top_p(zoo, value):
    generator, greedy = zoo
    assert len(set(greedy)) > 1  # a real answer, not one repeated id
    assert generator.generate(PROMPT, max_new_tokens=8, temperature=value).token_ids == greedy
    assert generator.generate(PROMPT, max_new_tokens=8, temperature=0.7, top_p=value, seed=3).token_ids == greedy
    session = generator.batch_session(2)
    handle = session.add(PROMPT, max_new_tokens=8, temperature=value)
    session.run()
    assert handle.result is not None and handle.result.token_ids == greedy


def test_the_cli_answers_greedy_text_at_a_vanishing_temperature(tiny_models, capsys):
    def token_ids(*options: str) -> list[int]:
        code = main(["generate", "--target", str(tiny_models["llama-target"]), "--max-new-tokens", "8",
                     "--ignore-eos", "--json", *options, "the cat sat"])
        out, err = capsys.readouterr()
        assert code == 0, err
        return json.loads(out)["token_ids"]

    greedy = token_ids()
    assert token_ids("--temperature", "1e-300") == greedy
    assert token_ids("--temperature", "0.9", "--top-p", "5e-324") == greedy
