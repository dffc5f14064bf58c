"""Policies (learners) that choose an arm each round, registered by name.

Importing this package registers every built-in policy.
"""

from draftwise.policies import simple, ucb  # noqa: F401  (registration side effects)
from draftwise.policies.base import POLICIES, Policy, make_policy, policy_options, register_policy

__all__ = ["POLICIES", "Policy", "make_policy", "policy_options", "register_policy"]
