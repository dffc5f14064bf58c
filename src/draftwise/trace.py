"""Round records, per-query statistics and the generation result.

Raw per-round records come first; every statistic is derived from them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RoundRecord:
    """What one round (draft → one target forward → accept) did and revealed.

    ``accept_probs[j]`` is the probability that the played drafter's token at draft position j
    is accepted given the target distribution at that position: 1 − TV(p, q) for LM drafters under
    sampling, p(x̂) for point-mass drafters under sampling (rejection sampling's probability, kept as
    the signal under coupled sampling too), 1[x̂ = argmax p] under greedy. It covers every drafted
    position (positions after the first rejection are conditioned on the draft). A tree's entries are
    per level; under coupled sampling they record whether the target's draw was among the children.

    ``counterfactual`` (full-information feedback, filled by the evaluation phase when a policy
    asks for it) maps every arm to its acceptance probabilities along the *verified* tokens of
    this round: ``counterfactual[i][j]`` for arm i at emitted position j.
    """

    index: int  # round number within the query, from 0
    arm: int
    arm_name: str
    max_draft: int  # L: the draft budget of this round
    drafted: int  # |X|: tokens the drafter actually proposed (≤ max_draft)
    accepted: int  # draft tokens accepted (the bonus / correction token not counted)
    emitted: int  # tokens appended to the output this round (accepted + 1 unless cut by a stop)
    position: int  # generated tokens before this round
    accept_probs: list[float] = field(default_factory=list)
    counterfactual: list[list[float]] | None = None
    reward: float | None = None
    draft_s: float = 0.0
    verify_s: float = 0.0
    policy_s: float = 0.0
    eval_s: float = 0.0

    @property
    def seconds(self) -> float:
        """Wall time of the round's measured parts."""
        return self.draft_s + self.verify_s + self.policy_s + self.eval_s

    def snapshot(self) -> RoundRecord:
        """A shallow copy, apart from later changes to this one (what a learner heard): 5× cheaper than
        ``dataclasses.replace``, and a batch of 32 makes one per lane every round."""
        copy = object.__new__(RoundRecord)
        copy.__dict__.update(self.__dict__)
        return copy

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Stats:
    """Per-query statistics, derived from the round records and the measured wall time."""

    new_tokens: int
    rounds: int
    target_calls: int
    mat: float  # tokens per target forward, the bonus token counted (plain decoding = 1.0)
    acceptance_rate: float  # accepted / drafted
    drafted: int
    accepted: int
    wall_s: float
    draft_s: float
    verify_s: float
    policy_s: float
    eval_s: float
    other_s: float
    tokens_per_s: float
    pulls: dict[str, int]
    stopped_by: str  # "eos", "max_new_tokens", "stop_string", "interrupted"
    prompt_tokens_cut: int = 0  # prompt tokens cut to fit the target's context (Request.truncate)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(records: list[RoundRecord], new_tokens: int, wall_s: float, stopped_by: str,
              extra_target_calls: int = 0) -> Stats:
    """Aggregate round records into :class:`Stats`."""
    drafted = sum(r.drafted for r in records)
    accepted = sum(r.accepted for r in records)
    timed = {key: sum(getattr(r, key) for r in records) for key in ("draft_s", "verify_s", "policy_s", "eval_s")}
    pulls = Counter(r.arm_name for r in records)
    rounds = len(records)
    return Stats(
        new_tokens=new_tokens,
        rounds=rounds,
        target_calls=rounds + extra_target_calls,
        mat=new_tokens / rounds if rounds else 0.0,
        acceptance_rate=accepted / drafted if drafted else 0.0,
        drafted=drafted,
        accepted=accepted,
        wall_s=wall_s,
        other_s=max(0.0, wall_s - sum(timed.values())),
        tokens_per_s=new_tokens / wall_s if wall_s > 0 else 0.0,
        pulls=dict(pulls),
        stopped_by=stopped_by,
        **timed,
    )


@dataclass
class GenerationResult:
    """Generated tokens (the prompt excluded), their text, statistics and the per-round trace."""

    token_ids: list[int]
    text: str
    stats: Stats
    trace: list[RoundRecord]
    prompt_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    error: str | None = None  # a query of a batch that could not run: why (nothing was generated)

    def to_dict(self, with_trace: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"text": self.text, "token_ids": self.token_ids, "stats": self.stats.to_dict()}
        if self.error is not None:
            out["error"] = self.error
        if with_trace:
            out["trace"] = [r.to_dict() for r in self.trace]
        return out

    def write_trace(self, path: str | Path) -> None:
        """Write the per-round trace as JSONL, one round per line."""
        write_jsonl(path, (r.to_dict() for r in self.trace))


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
