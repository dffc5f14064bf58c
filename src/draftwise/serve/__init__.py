"""``draftwise serve``: an OpenAI-compatible HTTP server over one :class:`~draftwise.api.Generator`.

* :mod:`~draftwise.serve.protocol` — request validation (OpenAI-shaped errors), response and chunk shapes,
  incremental detokenization with stop strings;
* :mod:`~draftwise.serve.scheduler` — one worker thread owning the generator and its batch session, a
  bounded queue, per-request event queues, cancellation;
* :mod:`~draftwise.serve.metrics` — the Prometheus registry (vLLM's spec-decode names plus the learner's);
* :mod:`~draftwise.serve.state` — the learner's state saved to / loaded from ``--state FILE`` (JSON, through
  the learner's schema);
* :mod:`~draftwise.serve.security` — who may call: the ``Host`` and ``Origin`` checks and the API key;
* :mod:`~draftwise.serve.app` — the Starlette routes; ``index.html`` — the live page at ``/``.

Needs the ``serve`` extra (``pip install -e ".[serve]"``): starlette, uvicorn, prometheus-client.
"""
