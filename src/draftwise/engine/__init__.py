"""The engine: the round loop and its helpers, each in its own module.

* :mod:`~draftwise.engine.loop` — one query, round by round: select → draft → verify → accept → feedback;
* :mod:`~draftwise.engine.batch` — many queries, one batched round at a time (a lane per query);
* :mod:`~draftwise.engine.session` — a continuous batch that queries join and leave between rounds;
* :mod:`~draftwise.engine.query` — one query's state (a batch holds one per query);
* :mod:`~draftwise.engine.evaluation` — the evaluation phase (full-information feedback);
* :mod:`~draftwise.engine.white_box` — the target's hidden states for white-box drafters.

Which arm a round plays, and what its learner hears, is decided in :mod:`draftwise.decision`.
"""

from draftwise.engine.loop import Engine, QueryOutcome
from draftwise.engine.query import PendingRound, QuerySettings, QueryState, StopCheck

__all__ = ["Engine", "PendingRound", "QueryOutcome", "QuerySettings", "QueryState", "StopCheck"]
