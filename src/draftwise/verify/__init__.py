"""Drafts and their verification against the target: pure tensor functions.

* :mod:`~draftwise.verify.draft` — a draft (a chain or a tree) and what a drafter may use besides the context;
* :mod:`~draftwise.verify.chain` — greedy and speculative-sampling verification of a chain;
* :mod:`~draftwise.verify.tree` — tree shapes, attention masks, positions and tree verification;
* :mod:`~draftwise.verify.coupling` — coupled sampling: the seed, not the drafts, decides every sampled token.
"""
