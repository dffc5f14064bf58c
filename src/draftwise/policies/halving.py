"""Sequential Halving and PETC (MetaSD Alg. 5 and 4): elimination, then commit (few switches).

Switching drafters costs a KV catch-up, so elimination-style learners that settle on one arm
early trade a little regret for few switches (MetaSD §H.1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from draftwise.errors import DraftwiseError
from draftwise.policies.base import Policy, register_policy


def halving_phases(n_arms: int) -> int:
    """Phases needed to get from K arms to one by keeping ⌈|S|/2⌉: ⌈log2 K⌉.

    MetaSD's Alg. 5 writes ⌊log2 K⌋, which leaves two survivors when K is not a power of two
    (K = 5 → 3 → 2); the ceiling always ends with one (Karnin et al. 2013 use ⌈log2 K⌉ too).

    >>> [halving_phases(k) for k in (1, 2, 5, 8)]
    [0, 1, 3, 3]
    """
    return math.ceil(math.log2(n_arms)) if n_arms > 1 else 0


def pulls_per_arm(budget: int, survivors: int, n_arms: int) -> int:
    """Alg. 5 line 3: n_t = ⌊T / (|S_t|·⌈log2 K⌉)⌋, at least one pull."""
    return max(1, budget // (survivors * max(halving_phases(n_arms), 1)))


def keep_best_half(survivors: list[int], totals: np.ndarray, rng: np.random.Generator) -> list[int]:
    """Alg. 5 line 6: keep the ⌈|S|/2⌉ survivors with the largest phase reward (random tie-break)."""
    keys = [(-totals[arm], rng.random(), arm) for arm in survivors]
    kept = sorted(keys)[: math.ceil(len(survivors) / 2)]
    return sorted(arm for _, _, arm in kept)


class HalvingPolicy(Policy):
    """Sequential Halving over the arms, then commit to the survivor for the rest of the query."""

    learned: ClassVar[tuple[str, ...]] = ("survivors", "pseudo", "pseudo_pulls", "schedule", "totals", "counts")

    def __init__(self, arms: Sequence[str], rng: np.random.Generator, **common: Any) -> None:
        super().__init__(arms, rng, **common)

    def reset(self) -> None:
        self.survivors = list(range(self.n_arms))
        self.pseudo = np.zeros(self.n_arms)  # warm-start reward added to the first phase
        self.pseudo_pulls = np.zeros(self.n_arms)
        self._new_phase()

    def warm_start(self, means: np.ndarray, weight: float) -> None:
        self.pseudo = weight * np.asarray(means, dtype=float)
        self.pseudo_pulls = np.full(self.n_arms, float(weight))
        self._new_phase()

    def phase_pulls(self) -> int:
        raise NotImplementedError

    def _new_phase(self) -> None:
        # Each survivor is pulled n times, interleaved (round-robin) so the phase is fair over time.
        n = self.phase_pulls() if len(self.survivors) > 1 else 0
        self.schedule = [arm for _ in range(n) for arm in self.survivors]
        self.totals = np.zeros(self.n_arms)
        self.counts = np.zeros(self.n_arms)

    @property
    def committed(self) -> int | None:
        return self.survivors[0] if len(self.survivors) == 1 else None

    def select(self) -> int:
        if self.committed is not None:
            return self.committed
        return self.schedule[0]

    def observe(self, arm: int, reward: float) -> None:
        if self.committed is not None:
            return
        if self.schedule and self.schedule[0] == arm:
            self.schedule.pop(0)
        elif arm in self.schedule:  # the engine played another arm than asked: count it anyway
            self.schedule.remove(arm)
        self.totals[arm] += reward
        self.counts[arm] += 1
        if not self.schedule:
            # Mean rather than sum: equal pulls make them the same, pseudo-counts make them differ.
            pulls = self.counts + self.pseudo_pulls
            mean = np.divide(self.totals + self.pseudo, pulls, out=np.zeros(self.n_arms), where=pulls > 0)
            self.survivors = keep_best_half(self.survivors, mean, self.rng)
            self.pseudo = np.zeros(self.n_arms)
            self.pseudo_pulls = np.zeros(self.n_arms)
            self._new_phase()

    def decay_state(self, factor: float) -> None:
        # Keeping across queries keeps the survivor set (and the commitment) as it is.
        pass

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "survivors": self.survivors, "committed": self.committed}

    def state_examples(self) -> dict[str, list[Any]]:
        return {"schedule": [[0]]}

    def check_state(self) -> None:
        survivors = self.survivors
        if not survivors or survivors != sorted(set(survivors)) or not 0 <= survivors[0] <= survivors[-1] < self.n_arms:
            raise ValueError(f"{type(self).__name__}: survivors {survivors} are not distinct arms of "
                             f"0..{self.n_arms - 1}")
        if not set(self.schedule) <= set(survivors):
            raise ValueError(f"{type(self).__name__}: the schedule plays arms that are not survivors")


@register_policy("halving")
class SequentialHalvingPolicy(HalvingPolicy):
    """MetaSD's SH as run in its experiments: ``period`` pulls per survivor per phase (§F.4: 1)."""

    summary = "Sequential Halving (MetaSD Alg. 5, period 1): halve the arms each phase, then commit"

    def __init__(self, arms: Sequence[str], rng: np.random.Generator, *, period: int = 1, **common: Any) -> None:
        if period < 1:
            raise DraftwiseError(f"halving: period must be >= 1, got {period}")
        self.period = period
        super().__init__(arms, rng, **common)

    def phase_pulls(self) -> int:
        return self.period


@register_policy("petc")
class PETCPolicy(HalvingPolicy):
    """PETC (MetaSD Alg. 4): SH with budget B0 = c·ln B, then commit to the survivor.

    B is the target response length in tokens. MetaSD states B0 in tokens while SH's budget counts
    pulls; we spend B0 pulls (rounds), each of which emits at least one token. Per phase each
    survivor gets ⌊B0 / (|S|·⌈log2 K⌉)⌋ pulls (at least one).
    """

    summary = "PETC (MetaSD Alg. 4): Sequential Halving with budget B0 = c·ln B pulls, then commit"

    def __init__(
        self, arms: Sequence[str], rng: np.random.Generator, *, c: float = 8.0, B: int = 1024, **common: Any
    ) -> None:
        if c <= 0 or B < 2:
            raise DraftwiseError(f"petc: need c > 0 and B >= 2, got c={c}, B={B}")
        self.budget = max(1, math.ceil(c * math.log(B)))
        super().__init__(arms, rng, **common)

    def phase_pulls(self) -> int:
        return pulls_per_arm(self.budget, len(self.survivors), self.n_arms)
