"""Every tensor follows the model's device.

There is no GPU here, so the test makes a stray tensor fail loudly instead: the models sit on the
CPU while the *default* device is ``meta``. A tensor built without an explicit device lands on
``meta`` and cannot meet the model's CPU tensors (or yields no data), so the generation fails or
differs. (On a CUDA machine, run the losslessness tests with ``device="cuda"`` as well.)
"""

from __future__ import annotations

import pytest
import torch

from draftwise import Generator

PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 10, 11]


@pytest.mark.parametrize("drafters,policy,temperature", [
    (["llama-near", "pld"], "ucb", 0.0),  # a bank member drafting one token at a time, a lookup
    (["llama-near", "llama-small", "suffix"], "hedgespec", 0.0),  # batched bank forwards (evaluation phase)
    (["lm:model={llama-near},tree=dynamic,topk=2,budget=6"], "fixed:0", 0.0),  # tree masks and positions
    (["llama-near", "llama-small", "pld"], "ctx-ucb", 0.0),  # routing (top-1 over the prompt), the default
    (["llama-near", "pld"], "ucb", 0.8),  # sampling
])
def test_no_tensor_is_built_off_the_models_device(tiny_models, drafters, policy, temperature) -> None:
    specs = [d.format(**{k: str(v) for k, v in tiny_models.items()}) if "{" in d
             else str(tiny_models[d]) if d.startswith("llama") else d for d in drafters]
    gen = Generator.from_pretrained(str(tiny_models["llama-target"]), drafters=specs, policy=policy)
    reference = gen.generate(PROMPT, max_new_tokens=30, ignore_eos=True, temperature=temperature, seed=3).token_ids
    with torch.device("meta"):
        again = gen.generate(PROMPT, max_new_tokens=30, ignore_eos=True, temperature=temperature, seed=3).token_ids
    assert again == reference


def test_a_timed_batched_forward_waits_for_an_asynchronous_device(monkeypatch) -> None:
    """Sampled rounds take no argmax (which would wait): the step-cost model times the forward, so on a
    GPU the forward must wait for its kernels; the CPU needs no wait."""
    from draftwise.models.batched_lm import wait_for

    waited: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: waited.append("cuda"))
    wait_for(torch.device("cpu"))
    assert waited == []
    wait_for(torch.device("cuda", 0))
    assert waited == ["cuda"]
