"""The static router baseline: TF-IDF features + multinomial logistic regression, in numpy.

It reads only the prompt and sends the whole query to one drafter, as the routing baselines of
MetaSD §4.3 and HedgeSpec §4.5 do. Labels are whatever the training set gives (a domain or a
drafter name); :func:`route_table` maps each label to a drafter of the pool.

>>> r = train_router(["def f(x): return x", "select name from t", "def g(): pass", "select * from u"],
...                  ["code", "sql", "code", "sql"], seed=0)
>>> r.predict(["def h(y): return y"]), r.predict(["select id from v"])
(['code'], ['sql'])
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from draftwise.errors import DraftwiseError

TOKEN = re.compile(r"[a-z0-9_]+|[^\sa-z0-9_]", re.IGNORECASE)
MAX_FEATURES = 4096  # the most frequent uni/bigrams by document frequency; dense matrices stay small
MIN_DF = 2  # a feature must occur in ≥ 2 training prompts
STEPS = 300  # full-batch gradient steps
LEARNING_RATE = 2.0  # rows are L2-normalised, so the loss is smooth enough for a large step
L2 = 1e-4  # weight decay
HYPERPARAMETERS = {"max_features": MAX_FEATURES, "min_df": MIN_DF, "steps": STEPS, "learning_rate": LEARNING_RATE,
                   "l2": L2}
ROUTER_FILE = "router.npz"  # the trained router shipped with the zoo (zoo/models/router.npz)


def features(text: str) -> list[str]:
    """Lower-cased word/symbol unigrams and bigrams.

    >>> features("Def f(x)")
    ['def', 'f', '(', 'x', ')', 'def f', 'f (', '( x', 'x )']
    """
    words = [w.lower() for w in TOKEN.findall(text)]
    return words + [f"{a} {b}" for a, b in itertools.pairwise(words)]


@dataclass
class Router:
    vocabulary: dict[str, int]
    idf: np.ndarray  # (F,)
    weights: np.ndarray  # (F, C)
    bias: np.ndarray  # (C,)
    labels: list[str]

    def transform(self, texts: Sequence[str]) -> np.ndarray:
        return tfidf(texts, self.vocabulary, self.idf)

    def predict(self, texts: Sequence[str]) -> list[str]:
        scores = self.transform(texts) @ self.weights + self.bias  # (N, C)
        return [self.labels[i] for i in scores.argmax(axis=1)]

    def accuracy(self, texts: Sequence[str], labels: Sequence[str]) -> float:
        return float(np.mean([p == y for p, y in zip(self.predict(texts), labels)])) if texts else 0.0


def tfidf(texts: Sequence[str], vocabulary: dict[str, int], idf: np.ndarray) -> np.ndarray:
    """Sublinear term frequency × idf, each row L2-normalised; (N, F)."""
    x = np.zeros((len(texts), len(vocabulary)), dtype=np.float32)
    for row, text in enumerate(texts):
        for term, count in Counter(features(text)).items():
            column = vocabulary.get(term)
            if column is not None:
                x[row, column] = 1.0 + np.log(count)
    x *= idf
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def fit_vocabulary(texts: Sequence[str], max_features: int, min_df: int) -> tuple[dict[str, int], np.ndarray]:
    df = Counter(term for text in texts for term in set(features(text)))
    # most frequent first, ties broken by the term itself so the vocabulary is deterministic
    kept = sorted((t for t, n in df.items() if n >= min_df), key=lambda t: (-df[t], t))[:max_features]
    if not kept:
        kept = sorted(df, key=lambda t: (-df[t], t))[:max_features]
    vocabulary = {t: i for i, t in enumerate(kept)}
    n = len(texts)
    idf = np.array([np.log((1 + n) / (1 + df[t])) + 1.0 for t in kept], dtype=np.float32)  # smoothed idf
    return vocabulary, idf


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def fit_logistic(x: np.ndarray, y: np.ndarray, n_classes: int, rng: np.random.Generator,
                 steps: int = STEPS, lr: float = LEARNING_RATE, l2: float = L2) -> tuple[np.ndarray, np.ndarray]:
    """Multinomial logistic regression by full-batch gradient descent with momentum."""
    w = rng.normal(0.0, 1e-3, size=(x.shape[1], n_classes)).astype(np.float32)
    b = np.zeros(n_classes, dtype=np.float32)
    onehot = np.eye(n_classes, dtype=np.float32)[y]  # (N, C)
    vw, vb = np.zeros_like(w), np.zeros_like(b)
    for _ in range(steps):
        error = (softmax(x @ w + b) - onehot) / len(x)  # gradient of the mean cross-entropy wrt the logits
        vw = 0.9 * vw + x.T @ error + l2 * w
        vb = 0.9 * vb + error.sum(axis=0)
        w -= lr * vw
        b -= lr * vb
    return w, b


def train_router(texts: Sequence[str], labels: Sequence[str], seed: int,
                 max_features: int = MAX_FEATURES, min_df: int = MIN_DF) -> Router:
    if not texts or len(texts) != len(labels):
        raise DraftwiseError("the router needs training prompts, one label each")
    classes = sorted(set(labels))
    vocabulary, idf = fit_vocabulary(texts, max_features, min_df)
    x = tfidf(texts, vocabulary, idf)
    y = np.array([classes.index(label) for label in labels])
    w, b = fit_logistic(x, y, len(classes), np.random.default_rng(seed))
    return Router(vocabulary, idf, w, b, classes)


def route_table(labels: Sequence[str], drafters: Sequence[str], label_domains: Mapping[str, Sequence[str]],
                fallback: str) -> dict[str, str]:
    """Label → drafter: the drafter named like the label, else one trained on that domain, else ``fallback``."""
    table = {}
    for label in labels:
        if label in drafters:
            table[label] = label
            continue
        specialists = [d for d in drafters if tuple(label_domains.get(d, ())) == (label,)]
        table[label] = specialists[0] if specialists else fallback
    return table


# ----------------------------------------------------------------------------- a router on disk


def save_router(router: Router, path: str | Path, info: dict[str, Any]) -> None:
    """One compressed ``.npz``: the arrays as trained (float32: predictions equal the trained
    router's) and ``info``, how it was built, as JSON. No pickles: loads with ``allow_pickle=False``."""
    terms = sorted(router.vocabulary, key=router.vocabulary.__getitem__)
    np.savez_compressed(
        path, terms=np.array(json.dumps(terms)), idf=router.idf, weights=router.weights, bias=router.bias,
        labels=np.array(json.dumps(router.labels)), info=np.array(json.dumps(info, sort_keys=True)),
    )


def load_router(path: str | Path) -> tuple[Router, dict[str, Any]]:
    """A router written by :func:`save_router` and the record of how it was built."""
    try:
        with np.load(path, allow_pickle=False) as data:
            terms = json.loads(str(data["terms"]))
            router = Router({t: i for i, t in enumerate(terms)}, data["idf"], data["weights"], data["bias"],
                            json.loads(str(data["labels"])))
            info = json.loads(str(data["info"]))
    except (OSError, KeyError, ValueError) as error:
        raise DraftwiseError(f"router file {path} is unreadable ({error}); rebuild it with "
                             "`draftwise zoo router`") from None
    if router.weights.shape != (len(terms), len(router.labels)):
        raise DraftwiseError(f"router file {path} is inconsistent; rebuild it with `draftwise zoo router`")
    return router, info
