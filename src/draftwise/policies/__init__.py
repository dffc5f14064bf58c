"""Policies (learners) that choose an arm each round, registered by name.

Importing this package registers every built-in policy.
"""

from draftwise.policies import (  # noqa: F401  (registration side effects)
    contextual,
    exp3,
    greedy,
    halving,
    hedge,
    hierarchical,
    presets,
    simple,
    thompson,
    ucb,
    ucb_family,
)
from draftwise.policies.base import (
    POLICIES,
    PRESETS,
    Policy,
    PolicyNeeds,
    PolicySpec,
    make_policy,
    parse_policy,
    policy_options,
    register_policy,
)

__all__ = ["POLICIES", "PRESETS", "Policy", "PolicyNeeds", "PolicySpec", "make_policy", "parse_policy",
           "policy_options", "register_policy"]
