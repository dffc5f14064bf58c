"""Hierarchical selection: one learner picks the drafter, another picks that drafter's arm.

Arms named ``DRAFTER+RULE`` (or ``DRAFTER@LEN…``) are grouped by drafter; the outer learner
chooses a group, the group's inner learner one of its arms (its stopping rule or length). Both
learn from every round they took part in, each with its own reward signal. Best with the
``drafters×stops`` layout, which is its default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from draftwise.policies.base import Policy, make_policy, register_policy
from draftwise.trace import RoundRecord


def drafter_of(arm_name: str) -> str:
    """``"code+svip"`` → ``"code"``; ``"pld@3"`` → ``"pld"``.

    >>> drafter_of("code+max-confidence:h=0.7"), drafter_of("pld@3"), drafter_of("none")
    ('code', 'pld', 'none')
    """
    return arm_name.split("+", 1)[0].split("@", 1)[0]


@register_policy("hierarchical")
class HierarchicalPolicy(Policy):
    """An outer learner over drafters, an inner learner per drafter over its arms."""

    summary = "one learner picks the drafter (outer), another its stopping rule (inner); arms drafters×stops"
    default_arms = "drafters×stops"
    learned: ClassVar[tuple[str, ...]] = ("outer", "inner")

    def __init__(self, arms: Sequence[str], rng: np.random.Generator, *, outer: str = "ucb", inner: str = "ucb1",
                 **common: Any) -> None:
        self.outer_spec, self.inner_spec = outer, inner
        names = list(arms)
        self.groups: list[str] = list(dict.fromkeys(drafter_of(a) for a in names))
        self.members: list[list[int]] = [[i for i, a in enumerate(names) if drafter_of(a) == g] for g in self.groups]
        super().__init__(arms, rng, **common)

    def reset(self) -> None:
        self.outer = make_policy(self.outer_spec, self.groups, self.rng)
        self.inner = [make_policy(self.inner_spec, [self.arms[i] for i in m], self.rng) for m in self.members]
        self.last: tuple[int, int] | None = None

    def begin_query(self, rng: np.random.Generator | None = None) -> None:
        super().begin_query(rng)
        for learner in (self.outer, *self.inner):
            learner.rng = self.rng
            learner.begin_query()

    def select(self) -> int:
        group = self.outer.select()
        local = self.inner[group].select()
        self.last = (group, local)
        return self.members[group][local]

    def update(self, arm: int, record: RoundRecord) -> float | None:
        group = next(g for g, m in enumerate(self.members) if arm in m)
        local = self.members[group].index(arm)
        reward = self.outer.update(group, record)
        self.inner[group].update(local, record)
        return reward

    def observe(self, arm: int, reward: float) -> None:
        group = next(g for g, m in enumerate(self.members) if arm in m)
        self.outer.observe(group, reward)
        self.inner[group].observe(self.members[group].index(arm), reward)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "outer": self.outer.state_dict(),
                "inner": {g: p.state_dict() for g, p in zip(self.groups, self.inner)}}
