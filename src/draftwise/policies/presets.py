"""The papers' configurations by name: a policy with its options, and the arms it plays.

``--policy hedgespec:warmup=4`` overrides one option of the preset; ``--arms`` overrides its
arm layout. Each preset says what the paper used; values the papers leave open are noted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftwise.policies.base import PRESETS

TAPOUT_RULES = "static/max-confidence/svip/adaedl/svip-difference/logit-margin"


@dataclass(frozen=True)
class Preset:
    policy: str  # the underlying registered policy
    options: dict[str, str] = field(default_factory=dict)  # its options, as spec strings
    arms: str = "drafters"  # the arm layout (draftwise.decision.arms)
    summary: str = ""
    max_draft: int | None = None  # draft budget under dynamic stopping rules
    draft_len: int | None = None  # draft length (the lengths layout's L; static rules)
    stops: tuple[str, ...] | None = None  # the stopping rules of the stops layouts


def _preset(name: str, preset: Preset) -> None:
    PRESETS.register(name)(preset)


# MetaSD: bandits over heterogeneous drafters, BD reward, β = 0.01 (§F.4), N_max = 5 in its tables.
_preset("metasd-ucb", Preset("ucb", {"beta": "0.01", "reward": "bd"},
                             summary="MetaSD-UCB (Alg. 2): UCB1, β 0.01, BD reward"))
_preset("metasd-exp3", Preset("exp3", {"gamma": "0.4", "reward": "bd"},
                              summary="MetaSD-EXP3 (Alg. 7): γ 0.4, BD reward"))
_preset("metasd-sh", Preset("halving", {"period": "1", "reward": "bd"},
                            summary="MetaSD Sequential Halving (Alg. 5), period 1"))
_preset("metasd-petc", Preset("petc", {"reward": "bd"},
                              summary="MetaSD PETC (Alg. 4): halving for c·ln B rounds, then commit"))
_preset("metasd-ducb", Preset("ducb", {"reward": "bd"},
                              summary="MetaSD Discounted UCB (Alg. 6) for non-stationary prompts"))
_preset("metasd-swucb", Preset("swucb", {"reward": "bd"},
                               summary="MetaSD Sliding-window UCB (Alg. 8) for non-stationary prompts"))
# BanditSpec: accepted length as reward over drafters (§6.1), throughput over draft lengths (§6.2).
_preset("banditspec-ucb", Preset("ucbspec", {"reward": "length"},
                                 summary="BanditSpec UCBSpec (Alg. 4) over drafters, accepted-length reward"))
_preset("banditspec-exp3", Preset("exp3spec", {"reward": "length"},
                                  summary="BanditSpec EXP3Spec (Alg. 5) over drafters"))
# §6.2's throughput is not a length in [1, L+1]: the radius's constant is measured (scale=std).
_preset("banditspec-length", Preset("ucbspec", {"reward": "throughput", "scale": "std"}, arms="lengths",
                                    summary="BanditSpec §6.2: UCBSpec over draft lengths 0..L of one drafter, "
                                            "throughput reward, the radius scaled by the rewards' spread"))
# HedgeSpec: NormalHedge on every drafter's counterfactual, §B.5 heuristics (6 warm-up rounds,
# batches of 12 rounds, evaluation every 6 tokens, acceptance loss for the first 3 vectors).
_preset("hedgespec", Preset("normalhedge", {"loss": "hybrid", "game": "chunk", "switch": "3", "warmup": "6",
                                            "every": "12", "skip": "6"},
                            summary="HedgeSpec: NormalHedge, length loss, chunk game, delayed feedback, hybrid loss, "
                                    "skipping updates"))
# TapOut: a bandit over dynamic stopping rules of one drafter; "unbounded" drafts (128 in the paper,
# 32 here: our drafters are small and the rules stop long before), blend reward α = 0.5.
_preset("tapout-seq-ucb1", Preset("ucb1", {"reward": "blend"}, arms="stops", max_draft=32, draft_len=6,
                                  summary="TapOut sequence level: UCB1 over stopping rules, blend reward"))
_preset("tapout-seq-ucbt", Preset("ucb-tuned", {"reward": "blend"}, arms="stops", max_draft=32, draft_len=6,
                                  summary="TapOut sequence level: UCB-Tuned over stopping rules, blend reward"))
_preset("tapout-seq-ts", Preset("ts-gaussian", {"reward": "blend"}, arms="stops", max_draft=32, draft_len=6,
                                summary="TapOut sequence level: Gaussian Thompson sampling over stopping rules"))
_preset("tapout-token-ts", Preset("fixed", {"arm": "0"}, arms="stops", max_draft=32,
                                  stops=("tapout-token:learner=ts-beta",),
                                  summary="TapOut token level: per-position Beta-Bernoulli Thompson sampling "
                                          "over rules"))
_preset("tapout-token-ucb1", Preset("fixed", {"arm": "0"}, arms="stops", max_draft=32,
                                    stops=("tapout-token:learner=ucb1",),
                                    summary="TapOut token level: per-position UCB1 over rules"))
