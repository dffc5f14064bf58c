"""The decision core: which arm each round plays, and what the learner hears.

* :mod:`~draftwise.decision.arms` — what a learner chooses among: a drafter (or none), a draft budget, a stopping rule;
* :mod:`~draftwise.decision.core` — one query's choices and feedback (:class:`~draftwise.decision.core.QueryDecider`),
  the load's limits, the warm start across queries;
* :mod:`~draftwise.decision.routing` — the prompt fit: routed arms and the prompt prior;
* :mod:`~draftwise.decision.step_costs` — what a batched step costs, and each request's share of it.

The names below are the core's public interface: what the engines and the vLLM proposer drive it with.
"""

from draftwise.decision.arms import NONE, Arm, ArmSettings, build_arms
from draftwise.decision.core import (
    NO_LIMITS,
    ArmBook,
    Choice,
    Key,
    Limits,
    LoadLearners,
    QueryDecider,
    arm_book,
    copy_learner,
    length_learner,
    load_limits,
    make_learner,
    warm_start,
)
from draftwise.decision.routing import PromptFit, routed_drafter
from draftwise.decision.step_costs import CutRound, StepCostModel, StepShape, attribute, batch_times

__all__ = ["NONE", "NO_LIMITS", "Arm", "ArmBook", "ArmSettings", "Choice", "CutRound", "Key", "Limits", "LoadLearners",
           "PromptFit", "QueryDecider", "StepCostModel", "StepShape", "arm_book", "attribute", "batch_times",
           "build_arms", "copy_learner", "length_learner", "load_limits", "make_learner", "routed_drafter",
           "warm_start"]
