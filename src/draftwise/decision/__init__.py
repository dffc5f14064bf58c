"""The decision core: which arm each round plays, and what the learner hears.

* :mod:`~draftwise.decision.arms` — what a learner chooses among: a drafter (or none), a draft budget, a stopping rule;
* :mod:`~draftwise.decision.core` — one query's choices and feedback (:class:`~draftwise.decision.core.QueryDecider`),
  the load's limits, the warm start across queries;
* :mod:`~draftwise.decision.routing` — the prompt fit: routed arms and the prompt prior;
* :mod:`~draftwise.decision.step_costs` — what a batched step costs, and each request's share of it.
"""
