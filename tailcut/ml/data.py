"""Generated, text-like classification data: bag-of-words documents drawn from topics.

Nothing is downloaded. Each of ``num_classes`` classes owns a topic (a word
distribution concentrated on a few dozen words of a shared vocabulary, half of them
shared with the neighbouring class); every class also draws most of its words from
one common, Zipf-shaped background distribution, the "function words". A document
is a random number of words, a random fraction of them from its class's topic and
the rest from the background. Short documents with little topic content are
genuinely ambiguous, so the task is not linearly trivial and accuracy climbs over
a few epochs instead of jumping to 100%.

Features are ``log1p(count)`` per word, L2-normalised per document (tf-style), as
float32; labels are int64. The same seed gives the same arrays on every host, so
the PS and each worker can generate the data themselves instead of shipping it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Dataset:
    """Train and test split of a classification problem, as numpy arrays."""

    x_train: np.ndarray  # (n_train, num_features) float32
    y_train: np.ndarray  # (n_train,) int64, values in [0, num_classes)
    x_test: np.ndarray  # (n_test, num_features) float32
    y_test: np.ndarray  # (n_test,) int64
    num_classes: int
    # Sizes a model needs that the arrays do not show (e.g. users and items of a
    # ratings matrix, a vocabulary), set by the generator that made the data.
    sizes: dict[str, int] = field(default_factory=dict)

    @property
    def num_features(self) -> int:
        return int(self.x_train.shape[1])


def make_text_dataset(
    seed: int = 0,
    *,
    num_classes: int = 10,
    vocab_size: int = 1000,
    num_train: int = 8000,
    num_test: int = 2000,
    mean_doc_words: float = 40.0,
    topic_words: int = 30,
    topic_fraction: float = 0.35,
) -> Dataset:
    """Generate a deterministic bag-of-words dataset.

    ``topic_fraction`` is the mean share of a document's words that come from its
    class's topic (the rest are background); lower is harder.
    """
    if not 0.0 < topic_fraction < 1.0:
        raise ValueError(f"topic_fraction={topic_fraction}: must be in (0, 1)")
    if 2 * topic_words > vocab_size:
        raise ValueError(f"topic_words={topic_words}: must be at most vocab_size/2")
    rng = np.random.default_rng(seed)
    background = _zipf(vocab_size, rng)
    topics = _topics(num_classes, vocab_size, topic_words, rng)

    n = num_train + num_test
    labels = rng.integers(0, num_classes, size=n)
    lengths = np.maximum(rng.poisson(mean_doc_words, size=n), 5)
    # Per-document topic share, Beta-distributed around topic_fraction: some
    # documents are clearly on topic, some are almost all function words.
    concentration = 4.0
    share = rng.beta(topic_fraction * concentration, (1 - topic_fraction) * concentration, n)
    n_topic = rng.binomial(lengths, share)
    n_background = lengths - n_topic

    counts = np.zeros((n, vocab_size), dtype=np.float32)
    docs = np.repeat(np.arange(n), n_background)
    words = rng.choice(vocab_size, size=docs.size, p=background)
    np.add.at(counts, (docs, words), 1.0)
    for c in range(num_classes):
        members = np.flatnonzero(labels == c)
        docs = np.repeat(members, n_topic[members])
        words = rng.choice(vocab_size, size=docs.size, p=topics[c])
        np.add.at(counts, (docs, words), 1.0)

    x = np.log1p(counts, out=counts)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = labels.astype(np.int64)
    return Dataset(
        x_train=x[:num_train],
        y_train=y[:num_train],
        x_test=x[num_train:],
        y_test=y[num_train:],
        num_classes=num_classes,
    )


def shard(x: np.ndarray, y: np.ndarray, index: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Return worker ``index``'s contiguous share of ``count`` near-equal shards.

    Sizes differ by at most one row; the data is already shuffled, so contiguous
    shards have the same class mix.
    """
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard index={index} count={count}: need 0 <= index < count")
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} rows but y has {len(y)}")
    bounds = np.linspace(0, len(x), count + 1).astype(int)
    lo, hi = bounds[index], bounds[index + 1]
    return x[lo:hi], y[lo:hi]


def _zipf(size: int, rng: np.random.Generator) -> np.ndarray:
    """Zipf(1) weights over a random permutation of the vocabulary."""
    weights = 1.0 / np.arange(1, size + 1)
    weights = weights[rng.permutation(size)]
    total: float = weights.sum()
    return weights / total


def _topics(
    num_classes: int, vocab_size: int, topic_words: int, rng: np.random.Generator
) -> np.ndarray:
    """One word distribution per class; class c shares half its words with c+1."""
    order = rng.permutation(vocab_size)
    half = topic_words // 2
    topics = np.zeros((num_classes, vocab_size))
    for c in range(num_classes):
        # A ring of overlapping windows: [c*half, c*half + topic_words) wraps.
        window = (np.arange(topic_words) + c * half) % vocab_size
        # Skewed weights inside a topic, so a few words are strong cues.
        weights = rng.dirichlet(np.full(topic_words, 0.5))
        topics[c, order[window]] = weights
    return topics
