"""The policy contract, its registry, and spec parsing (``"ucb:beta=0.1,reward=be"``).

A policy chooses one arm per round and learns from what the round revealed:

* bandit feedback — ``update(arm, record)`` turns the round record into the reward of the
  played arm with the policy's feedback signal and calls ``observe(arm, reward)``;
* full-information feedback — a policy with ``full_information = True`` gets records whose
  ``counterfactual`` holds every arm's acceptance probabilities (the engine's evaluation phase)
  and may call ``observe_losses(losses)`` with one loss per arm;
* delayed feedback — a policy is free to queue what ``update`` gives it and use it later
  (the engine never looks inside), so delayed-feedback wrappers need no engine change.

Every random choice goes through the injected ``numpy.random.Generator``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, Sequence

import numpy as np

from draftwise.errors import DraftwiseError
from draftwise.feedback import signal
from draftwise.options import keyword_defaults, split_spec, typed_options
from draftwise.registry import Registry
from draftwise.trace import RoundRecord


class Policy(ABC):
    """An online learner over a fixed list of arms (indices ``0..n_arms-1``)."""

    summary: ClassVar[str] = ""  # one line for `draftwise policies`
    full_information: ClassVar[bool] = False  # ask the engine for every arm's feedback each round

    def __init__(self, arms: Sequence[str], rng: np.random.Generator, *, reward: str = "bd") -> None:
        if not arms:
            raise DraftwiseError("a policy needs at least one arm")
        self.arms = list(arms)
        self.n_arms = len(self.arms)
        self.rng = rng
        self.reward = reward
        self._signal = signal(reward)
        self.reset()

    # -- lifecycle -------------------------------------------------------------------------
    def begin_query(self) -> None:
        """Called before each query. The papers re-initialise learners per query."""
        self.reset()

    @abstractmethod
    def reset(self) -> None:
        """Forget everything learned."""

    # -- decisions and feedback ------------------------------------------------------------
    @abstractmethod
    def select(self) -> int:
        """The arm to play this round."""

    def update(self, arm: int, record: RoundRecord) -> float | None:
        """Learn from a finished round; returns the reward used (for the trace)."""
        reward = self._signal(record)
        self.observe(arm, reward)
        return reward

    @abstractmethod
    def observe(self, arm: int, reward: float) -> None:
        """Bandit feedback: the reward of the arm that was played."""

    def observe_losses(self, losses: Sequence[float]) -> None:
        """Full-information feedback: one loss per arm (only full-information learners use it)."""
        raise NotImplementedError(f"{type(self).__name__} learns from bandit feedback only")

    def state_dict(self) -> dict[str, Any]:
        """A JSON-friendly snapshot of the learner's state."""
        return {"policy": type(self).__name__, "arms": self.arms, "reward": self.reward}


PolicyFactory = Callable[..., Policy]
POLICIES: Registry[PolicyFactory] = Registry("policy")


def register_policy(name: str) -> Callable[[PolicyFactory], PolicyFactory]:
    """Register a policy class (or a preset factory) under ``name``."""
    return POLICIES.register(name)


def policy_options(name: str) -> dict[str, Any]:
    """The options (with defaults) that ``name:key=value`` may set."""
    return keyword_defaults(POLICIES.get(name), skip=("arms", "rng"))


def make_policy(spec: str, arms: Sequence[str], rng: np.random.Generator) -> Policy:
    """Build a policy from a spec such as ``"ucb"``, ``"ucb:beta=0.1,reward=be"`` or ``"fixed:pld"``."""
    name, raw = _split_policy_spec(spec)
    factory = POLICIES.get(name)
    options = typed_options(f"policy {name!r}", raw, policy_options(name))
    return factory(arms, rng, **options)


def _split_policy_spec(spec: str) -> tuple[str, dict[str, str]]:
    # ``fixed:NAME`` is shorthand for ``fixed:arm=NAME``.
    head, _, rest = spec.partition(":")
    if rest and "=" not in rest.split(",")[0]:
        first, _, more = rest.partition(",")
        spec = f"{head}:arm={first}" + (f",{more}" if more else "")
    return split_spec(spec)
