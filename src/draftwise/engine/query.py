"""Everything one query carries through its rounds, in one object (a batch holds one per query)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from draftwise.decision.core import QueryDecider
from draftwise.drafters import DraftContext, StopRule
from draftwise.trace import RoundRecord
from draftwise.verify.chain import Sampling
from draftwise.verify.coupling import PositionNoise

# Given the generated tokens so far and how many of them the last round added, the length to keep
# if a stop string just completed, else None.
StopCheck = Callable[[list[int], int], "int | None"]


@dataclass(frozen=True)
class QuerySettings:
    max_new_tokens: int
    sampling: Sampling
    eos_ids: frozenset[int]
    stop_check: StopCheck | None = None
    prompt_cut: int = 0  # prompt tokens cut to fit the context (Request.truncate)


@dataclass
class PendingRound:
    """A round whose evaluation phase has not run yet."""

    record: RoundRecord
    start: int  # context length before the round's verified tokens
    rows: int  # verified tokens of the round
    choice: list[int]  # the target's argmax at those positions
    probs: torch.Tensor | None  # (rows, V) the warped target distribution (sampling)
    notes: dict[int, object]  # per evaluated drafter: what it noted as the round was verified


@dataclass
class QueryState:
    """One query's state: its tokens, settings, rounds, and what the engine's jobs keep for it.

    The engine's shared parts (target, drafters, arms, policy) never hold per-query state; a new
    query is a new :class:`QueryState`, so nothing is reset by hand. Its learner's decisions go
    through its :class:`~draftwise.decision.core.QueryDecider`.
    """

    context: list[int]  # prompt + generated so far
    prompt_len: int
    settings: QuerySettings
    dctx: DraftContext
    arm_drafter: list[int | None]  # each arm's drafter this query (a routed arm's is picked per query)
    unrouted: list[int]  # routed arms whose drafter is not picked yet
    rules: list[StopRule | None]  # each arm's stopping rule (stateful rules start afresh per query)
    decider: QueryDecider  # which arm each round plays, and what the learner hears
    records: list[RoundRecord] = field(default_factory=list)
    pending: list[PendingRound] = field(default_factory=list)  # rounds awaiting the evaluation phase
    pending_tokens: int = 0
    route_fits: dict[int, float] = field(default_factory=dict)  # routing's prompt fit per candidate drafter
    hidden_sent: int = 0  # positions whose target hidden states the white-box drafters have
    stopped_by: str | None = None  # eos, stop_string, interrupted, … (None: still running)

    @property
    def generated(self) -> int:
        return len(self.context) - self.prompt_len

    @property
    def finished(self) -> bool:
        """Stopped (EOS, a stop string) or out of new tokens."""
        return self.stopped_by is not None or self.generated >= self.settings.max_new_tokens

    @property
    def played(self) -> set[int | None]:
        """Drafters behind some arm this query (their counterfactual feedback is needed)."""
        return set(self.arm_drafter)


def new_query(prompt: Sequence[int], settings: QuerySettings, generator: torch.Generator | None,
              arm_drafter: list[int | None], routed: list[int], rules: list[StopRule | None],
              decider: QueryDecider) -> QueryState:
    noise = None
    if settings.sampling.coupled and not settings.sampling.greedy:
        assert generator is not None, "every sampled query has its generator"
        noise = PositionNoise(generator.initial_seed(), generator.device)
    dctx = DraftContext(settings.sampling, generator, settings.eos_ids, noise)
    return QueryState(list(prompt), len(prompt), settings, dctx, list(arm_drafter), list(routed), rules, decider)
