"""Training the zoo: corpus → tokenizer → target → drafters (and white-box heads), then install.

Nothing here runs at inference; the models it makes are loaded like any other checkpoint
(:mod:`draftwise.zoo` resolves their names).

* :mod:`~draftwise.training.corpus` — the corpus's sources, split into train / dev / test;
* :mod:`~draftwise.training.tokenizer` — the zoo's byte-level BPE tokenizer;
* :mod:`~draftwise.training.train` — the training loops (next-token training, logit distillation);
* :mod:`~draftwise.training.budgets` — named build budgets;
* :mod:`~draftwise.training.build` — ``draftwise zoo build``: the staged, resumable build;
* :mod:`~draftwise.training.labels` — a real target's own answers, the distillation labels;
* :mod:`~draftwise.training.distill` — drafters distilled for a real target;
* :mod:`~draftwise.training.heads` — EAGLE and Medusa heads trained on the zoo target;
* :mod:`~draftwise.training.evaluate` — greedy acceptance of every zoo drafter on every domain;
* :mod:`~draftwise.training.install` — a build's finished models copied into a zoo folder.
"""
