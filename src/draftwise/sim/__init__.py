"""A simulator of drafter pools calibrated on the papers' tables: checks the learners, no models needed.

No torch import anywhere below this package, so ``draftwise sim`` starts fast.
"""

from draftwise.sim.runner import simulate
from draftwise.sim.scenarios import SCENARIOS, Scenario, get_scenario

__all__ = ["SCENARIOS", "Scenario", "get_scenario", "simulate"]
