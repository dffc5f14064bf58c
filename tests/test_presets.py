"""Every paper preset is lossless (greedy: token for token; sampling: in distribution), and the
evaluation phase's counterfactual equals what each drafter gives when actually run on the prefix."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from test_lossless_greedy import _reference
from test_lossless_sampling import DRAFTERS, _model, chi_square_p, exact_joint
from transformers import AutoModelForCausalLM

from draftwise import Generator
from draftwise.api import DEFAULT_POLICY
from draftwise.drafters import DraftContext, LMDrafter, build_drafters
from draftwise.models.drafter_bank import BankLM, LlamaBank
from draftwise.models.loading import LoadOptions, load_causal_lm
from draftwise.policies import PRESETS
from draftwise.verify.chain import Sampling, warp

PRESET_NAMES = sorted(PRESETS) + [DEFAULT_POLICY]  # the papers' presets and our default


@pytest.fixture(scope="module")
def llama(tiny_models):
    options = LoadOptions()
    model, tokenizer = load_causal_lm(str(tiny_models["llama-target"]), options)
    specs = [str(tiny_models["llama-near"]), "pld", str(tiny_models["llama-small"]), "suffix"]
    return model, tokenizer, lambda: build_drafters(specs, model, tokenizer, options)


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_preset_greedy_matches_transformers(tiny_models, llama, preset: str) -> None:
    model, tokenizer, pool = llama
    reference = AutoModelForCausalLM.from_pretrained(tiny_models["llama-target"]).eval()
    gen = Generator(model, tokenizer, pool(), policy=preset)
    rng = random.Random(preset)
    for case in range(6):
        prompt = [rng.randrange(2, 50) for _ in range(rng.randint(2, 16))] * rng.randint(1, 2)
        max_new = rng.randint(8, 40)
        result = gen.generate(prompt, max_new_tokens=max_new, seed=case, ignore_eos=True)
        assert result.token_ids == _reference(reference, prompt, max_new, None), (preset, case)
        if gen.policy.full_information and result.stats.rounds > 1:
            assert any(r.counterfactual is not None for r in result.trace)


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_preset_sampling_follows_the_target(preset: str) -> None:
    target = _model(3, 2)
    sampling = Sampling(temperature=1.0)
    pool = [DRAFTERS["lm"](), DRAFTERS["pld"](), DRAFTERS["noise"]()]
    gen = Generator(target, None, pool, policy=preset, max_draft=4, draft_len=3)
    counts = np.zeros([5] * 3)
    for seed in range(1200):
        out = gen.generate([1, 2, 3, 1, 2, 3, 1, 2], max_new_tokens=3, temperature=1.0, seed=seed, ignore_eos=True)
        counts[tuple(out.token_ids)] += 1
    assert chi_square_p(counts, exact_joint(target, sampling)) > 1e-3


def _actual_acceptance(drafter, context: list[int], target_logits: torch.Tensor, sampling: Sampling,
                       head_dtype: str = "float32") -> float:
    """Run the drafter from scratch on the prefix and score its proposal against the target row."""
    if isinstance(drafter, LMDrafter):
        model = drafter.lm.model
        if head_dtype == "float32":
            fresh = model(torch.tensor([context])).logits[0, -1].float()
        else:  # the drafter alone on a fresh bank with the same head precision
            fresh = BankLM(LlamaBank([model], head_dtype), 0, model).logits(context, 1)[0]
        if sampling.greedy:
            return float(fresh.argmax() == target_logits.argmax())
        p, q = warp(target_logits[None], sampling)[0], warp(fresh[None], sampling)[0]
        return float(torch.minimum(p, q).sum())
    clone = type(drafter)()
    clone.begin_query(context)
    proposal = clone.propose(context, 1, DraftContext(sampling)).tokens
    if not proposal:
        return 0.0
    if sampling.greedy:
        return float(proposal[0] == int(target_logits.argmax()))
    return float(warp(target_logits[None], sampling)[0, proposal[0]])


@pytest.mark.parametrize("policy,head_dtype", [("normalhedge", "float32"), ("hedgespec", "float32"),
                                               ("hedgespec:game=token,skip=4,warmup=1", "float32"),
                                               ("hedgespec", "bfloat16")])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
@torch.inference_mode()
def test_counterfactual_is_exact(llama, policy: str, head_dtype: str, temperature: float) -> None:
    model, tokenizer, pool = llama
    gen = Generator(model, tokenizer, pool(), policy=policy, drafter_head_dtype=head_dtype)
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 10, 11, 5, 6]
    result = gen.generate(prompt, max_new_tokens=40, temperature=temperature, seed=3, ignore_eos=True)
    tokens = prompt + result.token_ids
    sampling = Sampling(temperature=temperature)
    checked = 0
    for record in result.trace:
        if record.counterfactual is None:
            continue
        start = len(prompt) + record.position
        for j in range(record.emitted):
            context = tokens[: start + j]
            target_logits = model(torch.tensor([context])).logits[0, -1].float()
            for arm, row in zip(gen.arms, record.counterfactual):
                expected = _actual_acceptance(gen.drafters[arm.drafter], context, target_logits, sampling, head_dtype)
                # bfloat16 banks also run wide forwards' layers in bfloat16, so a drafter's numbers
                # depend (to bfloat16 rounding) on how its tokens were batched
                tolerance = 1e-4 if head_dtype == "float32" else 1e-2
                assert row[j] == pytest.approx(expected, abs=tolerance), (record.index, j, arm.name)
                checked += 1
    assert checked >= 40 * len(gen.arms) * 0.5  # most positions were evaluated (skipping defers the tail)


def test_skipping_defers_and_batches_the_evaluation(llama, monkeypatch) -> None:
    from draftwise.engine import evaluation

    batches: list[int] = []
    original = evaluation.evaluate

    def counting(drafters, query):
        batches.append(query.pending_tokens)
        return original(drafters, query)

    monkeypatch.setattr(evaluation, "evaluate", counting)
    model, tokenizer, pool = llama
    gen = Generator(model, tokenizer, pool(), policy="hedgespec:warmup=2,skip=8")
    result = gen.generate([5, 6, 7, 8] * 3, max_new_tokens=60, seed=0, ignore_eos=True)
    assert len(batches) < result.stats.rounds  # fewer evaluation phases than rounds
    assert all(size >= 8 for size in batches[2:])  # after warm-up, only once 8 tokens gathered
    delivered = [r for r in result.trace if r.counterfactual is not None]
    assert sum(batches) == sum(r.emitted for r in delivered)  # each evaluated token once
    assert all(r.reward is not None for r in delivered)


def test_prompt_prior_starts_on_the_drafter_that_predicts_the_prompt(tiny_models, llama) -> None:
    model, tokenizer, _ = llama
    # a prompt the target itself wrote: the target's twin predicts every token of it
    seed_prompt = [5, 9, 13]
    written = Generator(model, tokenizer, [], policy="fixed:0").generate(
        seed_prompt, max_new_tokens=40, ignore_eos=True)
    prompt = seed_prompt + written.token_ids
    options = LoadOptions()
    specs = ["pld", str(tiny_models["llama-small"]), str(tiny_models["llama-twin"])]
    for policy, first in (("ucb:prompt_prior=3", "llama-twin"), ("hedgespec:prompt_prior=4", None)):
        gen = Generator(model, tokenizer, build_drafters(specs, model, tokenizer, options), policy=policy)
        result = gen.generate(prompt, max_new_tokens=24, ignore_eos=True)
        if first is not None:
            assert result.trace[0].arm_name == first, policy
        if "prompt_prior" in policy:
            assert result.stats.pulls.get("llama-twin", 0) >= 0.8 * result.stats.rounds, policy
