"""torch's thread-local autograd modes, put back after an interrupt.

A Ctrl-C (any asynchronous exception) can land between a mode guard's entry and the ``with`` that
would exit it. A ``no_grad`` guard is then never exited: autograd stays off. An ``inference_mode``
guard is exited only when the traceback that holds it is freed — after the guards around it have
exited — and it restores the state it saw on entry: inference mode *on* (the outer guard's), with
no guard left to turn it off. Every later training step of the process then fails ("element 0 of
tensors does not require grad"). A timer interrupt at a random point (``tests/test_interrupt.py``)
strands it about once in 500; a user's Ctrl-C can do the same.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

# Guards that turned a stranded inference mode off. Never exited (that would turn it back on); one
# per stranding, which takes an interrupt at one exact bytecode.
_KEPT: list[Any] = []


@dataclass(frozen=True)
class GradModes:
    """Whether autograd and inference mode were on, to put them back as they were."""

    grad: bool
    inference: bool

    @classmethod
    def now(cls) -> GradModes:
        return cls(torch.is_grad_enabled(), torch.is_inference_mode_enabled())

    def restore(self) -> None:
        """Put the modes back. Call it once the interrupt's traceback is freed (the guards it held
        have exited by then)."""
        if torch.is_inference_mode_enabled() and not self.inference:
            guard = torch._C._InferenceMode(False)
            guard.__enter__()
            _KEPT.append(guard)
            log.debug("an interrupt left inference mode on; turned off")
        if torch.is_grad_enabled() != self.grad:
            torch.set_grad_enabled(self.grad)


def interrupted(error: BaseException, modes: GradModes) -> None:
    """A caught interrupt ends here: its traceback is dropped (which exits the guards it held) and
    the modes of ``modes`` are restored."""
    error.__traceback__ = None
    modes.restore()
