"""The engine: the round loop and its four helpers, each in its own module.

* :mod:`~draftwise.engine.loop` — select → draft → verify → accept → feedback;
* :mod:`~draftwise.engine.query` — one query's state (a batch holds one per query);
* :mod:`~draftwise.engine.routing` — the prompt fit: routed arms and the prompt prior;
* :mod:`~draftwise.engine.evaluation` — the evaluation phase (full-information feedback);
* :mod:`~draftwise.engine.white_box` — the target's hidden states for white-box drafters.
"""

from draftwise.engine.loop import Engine, QueryOutcome
from draftwise.engine.query import PendingRound, QuerySettings, QueryState, StopCheck
from draftwise.engine.routing import PROMPT_LOOKBACK, PROMPT_WINDOW, PromptFit

__all__ = ["PROMPT_LOOKBACK", "PROMPT_WINDOW", "Engine", "PendingRound", "PromptFit", "QueryOutcome",
           "QuerySettings", "QueryState", "StopCheck"]
