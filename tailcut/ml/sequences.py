"""Generated toy translation task for the RNN: a delayed, word-by-word "dictionary" mapping.

Nothing is downloaded. A source sentence is ``length`` random tokens from a
vocabulary of ``vocab`` words; the target at position t is ``dictionary[source[t -
delay]]`` for a fixed random dictionary (a permutation of the vocabulary). To emit
a word the model must remember the word it read ``delay`` steps ago and translate
it, so the hidden state has to carry information across time steps and the
gradient has to flow back through time (BPTT). Positions t < delay have nothing to
translate yet and are marked -1 (ignored by the loss and accuracy).

To keep the task from being solvable to 100% and give a learning curve, a share of
the source words (``noise``) is replaced by a random word in the target too (a
"free translation" the model cannot predict).

``x`` and ``y`` are int64 of shape (n, length).
"""

from __future__ import annotations

import numpy as np

from tailcut.ml import data

IGNORE = -1  # target label of positions without a translation


def make_translation_dataset(
    seed: int = 0,
    *,
    vocab: int = 32,
    length: int = 12,
    delay: int = 3,
    num_train: int = 6000,
    num_test: int = 1500,
    noise: float = 0.05,
) -> data.Dataset:
    """Generate a deterministic sequence-to-sequence dataset."""
    if not 0 < delay < length:
        raise ValueError(f"delay={delay}: must be in (0, length={length})")
    if not 0.0 <= noise < 1.0:
        raise ValueError(f"noise={noise}: must be in [0, 1)")
    rng = np.random.default_rng(seed)
    dictionary = rng.permutation(vocab)
    n = num_train + num_test
    x = rng.integers(0, vocab, (n, length))
    y = np.full((n, length), IGNORE, dtype=np.int64)
    y[:, delay:] = dictionary[x[:, :-delay]]
    free = rng.random((n, length)) < noise
    free[:, :delay] = False
    y[free] = rng.integers(0, vocab, int(free.sum()))
    return data.Dataset(
        x_train=x[:num_train].astype(np.int64),
        y_train=y[:num_train],
        x_test=x[num_train:].astype(np.int64),
        y_test=y[num_train:],
        num_classes=vocab,
        sizes={"vocab": vocab, "length": length},
    )
