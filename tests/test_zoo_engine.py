"""The shipped zoo through the engine: greedy losslessness on zoo models, and the embedded
default of `draftwise generate` (no --target: zoo target, every zoo drafter, PLD and suffix)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from draftwise import Generator
from draftwise.cli import main
from draftwise.zoo import load

needs_zoo = pytest.mark.skipif(not (load.shipped_models_dir() / load.MANIFEST).exists(),
                               reason="no zoo shipped in src/draftwise/zoo/models yet")
PROMPTS = [
    "Write a Python function that returns the largest element of a list.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Translate to German: The weather is nice today.",
    "what is the capital of france",
]


@needs_zoo
def test_greedy_losslessness_on_zoo_models() -> None:
    gen = Generator.from_pretrained("zoo:target", ["zoo:all", "pld", "suffix"], policy="ucb")
    reference = AutoModelForCausalLM.from_pretrained(load.resolve_zoo_name("zoo:target")).eval()
    mats = []
    for prompt in PROMPTS:
        result = gen.generate(prompt, max_new_tokens=48)
        ids = torch.tensor([result.prompt_ids])
        with torch.inference_mode():
            out = reference.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=48)
        expected = out[0, ids.shape[1]:].tolist()
        eos = gen.eos_ids
        cut = next((i + 1 for i, t in enumerate(expected) if t in eos), len(expected))
        assert result.token_ids == expected[:cut], prompt
        mats.append(result.stats.mat)
    assert sum(mats) / len(mats) > 1.2  # the zoo's drafters do accelerate


@needs_zoo
def test_generate_with_the_zoo_target_uses_its_whole_pool(capsys) -> None:
    code = main(["generate", "--target", "zoo:target", "--max-new-tokens", "24", "--json", PROMPTS[0]])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["stats"]["new_tokens"] > 0
    # auto@4+gain=code → code (a routed arm names its pick); the pick suffix/pld@8 → suffix, pld;
    # generalist@3+max-confidence:h=0.3 → generalist
    drafters = {d for name in out["stats"]["pulls"]
                for d in ([name.rsplit("=", 1)[-1]] if name.startswith("auto@") else name.split("@")[0].split("/"))}
    assert drafters <= {*load.zoo_drafter_names(), "pld", "suffix", "none"}


@needs_zoo
def test_the_default_drafts_with_the_zoo_generalist_alone() -> None:
    gen = Generator.from_pretrained("zoo:target", ["zoo:all", "pld", "suffix"])
    domains = {d.name: getattr(d, "domains", None) for d in gen.drafters}
    assert domains["code"] == ("code",) and domains["generalist"] == load.zoo_domain_of("zoo:generalist")
    assert domains["pld"] is None  # a lookup has no domains
    model_arms = [a for a in gen.arms if a.drafter is not None and gen.drafters[a.drafter].name == "generalist"]
    assert len(model_arms) == 1 and model_arms[0].route == ()  # trained on every domain: no routing
