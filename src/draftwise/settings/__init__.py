"""Settings parsed once, at the edges (CLI, API, server, bench, vLLM config), into typed, frozen, checked objects.

* :mod:`~draftwise.settings.request` — one query's request: how many tokens, how to sample, when to stop.
"""
