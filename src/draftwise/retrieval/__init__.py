"""Retrieval: text corpora, suffix arrays over their tokens, and the datastores built from them.

* :mod:`~draftwise.retrieval.corpora` — reading plain-text or JSONL corpora;
* :mod:`~draftwise.retrieval.suffix_array` — suffix-array matching over a token stream;
* :mod:`~draftwise.retrieval.datastore` — a datastore on disk that the ``rest`` drafter reads.
"""
