"""Generated click logs for the sparse model: high-dimensional ids with Zipf popularity.

Nothing is downloaded. Like the recommendation and search workloads of the IMC'20
paper, every example is a handful of categorical feature ids (user, item, query
terms, ... hashed into one space of ``num_features`` ids) and a click label. Ids
are drawn from a Zipf law over a random permutation of the id space, so a few
thousand "hot" ids appear in most examples while most ids are seen a handful of
times: the skewed update frequency per parameter that paper measured.

The label comes from a hidden model of the same family as the sparse model: a
weight per id (``wide_share`` of the signal) plus a small ReLU network over
hidden embeddings of the ids; a click is drawn with probability ``sigmoid(signal
* score)``. Labels are random given the features, so accuracy has a ceiling below 1.

``x`` is int64 of shape (n, fields), ``y`` int64 clicks (0 or 1).
"""

from __future__ import annotations

import numpy as np

from tailcut.ml import data


def make_click_dataset(
    seed: int = 0,
    *,
    num_features: int = 10000,
    fields: int = 8,
    num_train: int = 48000,
    num_test: int = 5000,
    zipf_exponent: float = 1.1,
    teacher_dim: int = 4,
    wide_share: float = 0.3,
    signal: float = 3.0,
) -> data.Dataset:
    """Generate a deterministic click dataset with ``fields`` ids per example."""
    if fields < 2:
        raise ValueError(f"fields={fields}: need at least 2 (a user and something else)")
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, num_features + 1) ** zipf_exponent
    popularity = popularity[rng.permutation(num_features)]
    popularity /= popularity.sum()
    n = num_train + num_test
    x = rng.choice(num_features, size=(n, fields), p=popularity)

    # The hidden "teacher" has the student's shape (wide weights + embeddings into a
    # ReLU layer), so the task is learnable, but the deep part needs the embeddings
    # of many ids to be learned before it helps: accuracy climbs over epochs.
    wide = rng.normal(0.0, 1.0, num_features)
    embed = rng.normal(0.0, 1.0, (num_features, teacher_dim))
    w1 = rng.normal(0.0, 1.0 / np.sqrt(fields * teacher_dim), (fields * teacher_dim, 16))
    w2 = rng.normal(0.0, 1.0 / np.sqrt(16), 16)
    deep = np.maximum(embed[x].reshape(n, -1) @ w1, 0) @ w2
    wide_part = wide[x].sum(axis=1)
    score = wide_share * _standard(wide_part) + (1 - wide_share) * _standard(deep)
    score *= signal
    clicks = rng.random(n) < 1.0 / (1.0 + np.exp(-score))
    y = clicks.astype(np.int64)
    return data.Dataset(
        x_train=x[:num_train].astype(np.int64),
        y_train=y[:num_train],
        x_test=x[num_train:].astype(np.int64),
        y_test=y[num_train:],
        num_classes=2,
        sizes={"features": num_features, "fields": fields},
    )


def _standard(v: np.ndarray) -> np.ndarray:
    """Zero mean, unit standard deviation."""
    standard: np.ndarray = (v - v.mean()) / max(float(v.std()), 1e-12)
    return standard
