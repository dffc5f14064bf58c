"""Non-learning policies: a fixed arm, round-robin and uniform random (baselines)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from draftwise.errors import DraftwiseError
from draftwise.policies.base import Policy, register_policy


@register_policy("fixed")
class FixedPolicy(Policy):
    """Always play one arm (``fixed:<arm name or index>``)."""

    summary = "always the same arm: fixed:<arm>"
    priced = False  # a fixed configuration drafts as configured

    def __init__(self, arms: Sequence[str], rng: np.random.Generator, *, arm: str = "0", reward: str = "bd") -> None:
        self.choice = _resolve_arm(arm, list(arms))
        super().__init__(arms, rng, reward=reward)

    def reset(self) -> None:
        pass

    def select(self) -> int:
        return self.choice

    def observe(self, arm: int, reward: float) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "choice": self.choice}


@register_policy("round-robin")
class RoundRobinPolicy(Policy):
    """Cycle through the arms in order."""

    summary = "cycle through the arms in order"
    learned: ClassVar[tuple[str, ...]] = ("t",)

    def reset(self) -> None:
        self.t = 0

    def select(self) -> int:
        return self.t % self.n_arms

    def observe(self, arm: int, reward: float) -> None:
        self.t += 1

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "t": self.t}


@register_policy("random")
class RandomPolicy(Policy):
    """A uniformly random arm every round."""

    summary = "a uniformly random arm each round"

    def reset(self) -> None:
        pass

    def select(self) -> int:
        return int(self.rng.integers(self.n_arms))

    def observe(self, arm: int, reward: float) -> None:
        pass


def _resolve_arm(arm: str, arms: list[str]) -> int:
    if arm in arms:
        return arms.index(arm)
    if arm.isdigit() and int(arm) < len(arms):
        return int(arm)
    raise DraftwiseError(f"fixed: no arm {arm!r}; arms are: {', '.join(arms)}")
