"""The models: loading Hugging Face causal LMs, the target's KV caches and the drafter bank.

* :mod:`~draftwise.models.loading` — a local path, a hub id, ``zoo:NAME`` or a named model → a loaded LM;
* :mod:`~draftwise.models.named_models` — named real models (``smollm2``), fetched once and cached;
* :mod:`~draftwise.models.defaults` — the target and drafter pool used when none is named;
* :mod:`~draftwise.models.cached_lm` — one query's target (or drafter) with a KV cache that follows its context;
* :mod:`~draftwise.models.batched_lm` — one target forward for many queries;
* :mod:`~draftwise.models.drafter_bank` — one forward for several small drafters of one shape;
* :mod:`~draftwise.models.vocab_map` — drafters that speak a subset of the target's vocabulary;
* :mod:`~draftwise.models.grad_modes` — the autograd mode a forward runs under.
"""
