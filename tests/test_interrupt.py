"""An interrupt (Ctrl-C, a timer signal) at any point of a generation leaves the Generator exact:
its next generation reproduces the reference output token for token."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from draftwise import Generator
from draftwise.drafters import Drafter
from draftwise.models.grad_modes import GradModes, interrupted
from draftwise.verify.draft import Draft


class Alarm:
    """Raise KeyboardInterrupt after a delay, once; disarmed before the test inspects anything."""

    def __init__(self) -> None:
        self.armed = False
        self.previous = signal.signal(signal.SIGALRM, self._fire)

    def _fire(self, signum, frame) -> None:
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt

    def run(self, delay: float, call) -> str:
        """Run ``call`` with an interrupt due after ``delay`` seconds: how it ended."""
        outcome = "finished"
        modes = GradModes.now()
        try:
            try:
                self.armed = True
                signal.setitimer(signal.ITIMER_REAL, delay)
                result = call()
                outcome = result.stats.stopped_by
            finally:
                self.armed = False
                signal.setitimer(signal.ITIMER_REAL, 0)
        except KeyboardInterrupt as error:  # outside the engine's own catch: restore torch's modes here
            interrupted(error, modes)
            outcome = "raised"
        return outcome

    def close(self) -> None:
        signal.signal(signal.SIGALRM, self.previous)


@pytest.mark.parametrize("drafters,policy", [
    (["llama-near", "pld"], "ucb"),  # LM drafter on a bank, a lookup, a bandit
    (["llama-near", "llama-small", "suffix"], "hedgespec"),  # the evaluation phase (batched bank forwards)
])
def test_generator_is_exact_after_interrupts_at_random_points(tiny_models, drafters, policy) -> None:
    specs = [str(tiny_models[d]) if d.startswith("llama") else d for d in drafters]
    gen = Generator.from_pretrained(str(tiny_models["llama-target"]), drafters=specs, policy=policy)
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 10, 11]
    reference = Generator.from_pretrained(str(tiny_models["llama-target"]), policy="fixed:none").generate(
        prompt, max_new_tokens=60, ignore_eos=True).token_ids
    assert gen.generate(prompt, max_new_tokens=60, ignore_eos=True).token_ids == reference  # warm-up
    start = time.perf_counter()
    gen.generate(prompt, max_new_tokens=60, ignore_eos=True)
    full = time.perf_counter() - start
    rng = np.random.default_rng(0)
    alarm = Alarm()
    outcomes = []
    try:
        # until 15 generations were cut short (a busy machine stretches some runs past their alarm)
        while sum(o in ("interrupted", "raised") for o in outcomes) < 15 and len(outcomes) < 80:
            outcomes.append(alarm.run(float(rng.uniform(0.02, 0.8)) * full,
                                      lambda: gen.generate(prompt, max_new_tokens=60, ignore_eos=True)))
            again = gen.generate(prompt, max_new_tokens=60, ignore_eos=True)
            assert again.token_ids == reference, f"after interrupt {len(outcomes)} ({outcomes[-1]})"
    finally:
        alarm.close()
    assert sum(o in ("interrupted", "raised") for o in outcomes) >= 15


@pytest.mark.parametrize("draft_len", [1, 16])
def test_stop_string_is_found_however_many_tokens_a_round_emits(tiny_models, draft_len) -> None:
    """A drafter identical to the target accepts whole 16-token drafts: a stop string completed in the
    middle of such a round must still end the output there, as it does one token per round."""
    target = str(tiny_models["llama-target"])
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 10, 11]
    plain = Generator.from_pretrained(target, policy="fixed:none")
    reference = plain.generate(prompt, max_new_tokens=60, ignore_eos=True).token_ids
    words = [plain.tokenizer.decode([t]) for t in reference]
    # a word first seen well after the start (so that a 16-token round completes it in its middle)
    position = next(i for i in range(14, 60)
                    if words[i].strip() and words[i] not in words[:i] and i % 17 not in (0, 16))
    gen = Generator.from_pretrained(target, drafters=[str(tiny_models["llama-twin"])], policy="fixed:0",
                                    draft_len=draft_len)
    result = gen.generate(prompt, max_new_tokens=60, ignore_eos=True, stop=[words[position]])
    assert result.stats.stopped_by == "stop_string"
    assert result.token_ids == reference[: position + 1]
    assert result.stats.mat > (4 if draft_len == 16 else 1.5)  # whole drafts were accepted


class StrandsInferenceMode(Drafter):
    """Interrupted inside a nested inference-mode guard's entry, after the guard took effect and
    before its ``with`` began (what a timer signal or Ctrl-C can hit): the outer guard exits as the
    interrupt passes, the inner one only when its traceback is freed — restoring inference mode *on*."""

    name = "strands"

    @torch.inference_mode()
    def propose(self, context, max_len, ctx, stop=None) -> Draft:
        inner = torch._C._InferenceMode(True)
        inner.__enter__()
        raise KeyboardInterrupt


@pytest.mark.parametrize("batched", [False, True])
def test_an_interrupt_leaves_torchs_grad_modes_as_it_found_them(tiny_models, batched) -> None:
    """After an interrupted generation autograd still works (a stranded inference mode or autograd
    switched off would fail every later training step of the process)."""
    gen = Generator(AutoModelForCausalLM.from_pretrained(str(tiny_models["llama-target"])), None,
                    [StrandsInferenceMode()], policy="fixed:0")
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 10, 11]
    if batched:
        result = gen.generate_batch([prompt], max_new_tokens=8)[0]
    else:
        result = gen.generate(prompt, max_new_tokens=8)
    assert result.stats.stopped_by == "interrupted"
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    weight = torch.ones(2, requires_grad=True)
    (weight * 3).sum().backward()
    assert weight.grad is not None


def test_grad_modes_are_restored_after_a_stranded_guard() -> None:
    modes = GradModes.now()
    outer = torch.inference_mode()
    outer.__enter__()
    inner = torch._C._InferenceMode(True)
    inner.__enter__()
    outer.__exit__(None, None, None)  # the outer guard exits first, as the interrupt passes it
    del inner  # freed with the traceback: it restores what it saw on entry
    assert torch.is_inference_mode_enabled()
    modes.restore()
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    torch.set_grad_enabled(False)  # a no_grad never exited
    modes.restore()
    assert torch.is_grad_enabled()
