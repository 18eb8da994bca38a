"""A wide-and-deep style sparse model: per-id weights plus embeddings into a small MLP head.

Each example is ``F`` feature ids. The logit is ``bias + sum_f wide[id_f] +
head(embeddings)``, where the head concatenates the ``F`` looked-up embeddings
(field order matters: the first field is the user) and applies one ReLU layer
and a linear output. Only the rows of the ids in a batch get a non-zero
gradient, and ids follow a Zipf law, so a few rows are in every update and most
in almost none. Layout, in forward order, for ``V`` ids, embedding size ``d``,
``F`` fields and ``H`` hidden units::

    embed.weight  (V, d)
    wide.weight   (V,)
    fc1.weight    (F*d, H)   fc1.bias (H,)
    fc2.weight    (H,)       fc2.bias (1,)

Trained with the logistic loss; accuracy thresholds the click probability at 0.5.
"""

from __future__ import annotations

import numpy as np

from tailcut.ml.models import Layer, check_params, layout, views

_EVAL_BATCH = 4096


class Sparse:
    """Embeddings + wide weights + MLP head, logistic loss on a click label."""

    name = "sparse"

    def __init__(self, num_features: int, fields: int, dim: int = 8, hidden: int = 32) -> None:
        self.num_features = num_features
        self.fields = fields
        self.dim = dim
        self.hidden = hidden
        self.layers: tuple[Layer, ...] = layout(
            [
                ("embed.weight", (num_features, dim)),
                ("wide.weight", (num_features,)),
                ("fc1.weight", (fields * dim, hidden)),
                ("fc1.bias", (hidden,)),
                ("fc2.weight", (hidden,)),
                ("fc2.bias", (1,)),
            ]
        )
        last = self.layers[-1]
        self.num_params = last.offset + last.size

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """Small embeddings, zero wide weights, He-initialised head."""
        params = np.zeros(self.num_params, dtype=np.float32)
        emb, _, w1, _, w2, _ = views(self.layers, params)
        emb[...] = rng.normal(0.0, 0.1, emb.shape)
        w1[...] = rng.normal(0.0, np.sqrt(2.0 / w1.shape[0]), w1.shape)
        w2[...] = rng.normal(0.0, np.sqrt(1.0 / self.hidden), w2.shape)
        return params

    def loss_and_grad(
        self, params: np.ndarray, x: np.ndarray, y: np.ndarray
    ) -> tuple[float, np.ndarray]:
        """Mean logistic loss over the batch and its gradient, flat like ``params``."""
        check_params(params, self.num_params)
        emb, wide, w1, b1, w2, b2 = views(self.layers, params)
        n = max(len(x), 1)
        z = emb[x].reshape(len(x), -1)  # (n, F*d)
        pre = z @ w1 + b1
        h = np.maximum(pre, 0)
        logit = h @ w2 + b2[0] + wide[x].sum(axis=1)
        loss, dlogit = _logistic(logit, y)

        grad = np.zeros_like(params)
        gemb, gwide, gw1, gb1, gw2, gb2 = views(self.layers, grad)
        dlogit /= n
        gb2[0] = dlogit.sum()
        gw2[...] = h.T @ dlogit
        np.add.at(gwide, x.ravel(), np.repeat(dlogit, x.shape[1]))
        dh = np.outer(dlogit, w2)
        dh[pre <= 0] = 0
        gw1[...] = z.T @ dh
        gb1[...] = dh.sum(axis=0)
        dz = (dh @ w1.T).reshape(len(x) * self.fields, self.dim)
        np.add.at(gemb, x.ravel(), dz)
        return loss, grad

    def evaluate(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """Mean logistic loss and accuracy (click probability above 0.5 means click)."""
        check_params(params, self.num_params)
        emb, wide, w1, b1, w2, b2 = views(self.layers, params)
        total_loss = 0.0
        correct = 0
        for lo in range(0, len(x), _EVAL_BATCH):
            xb, yb = x[lo : lo + _EVAL_BATCH], y[lo : lo + _EVAL_BATCH]
            z = emb[xb].reshape(len(xb), -1)
            logit = np.maximum(z @ w1 + b1, 0) @ w2 + b2[0] + wide[xb].sum(axis=1)
            loss, _ = _logistic(logit, yb)
            total_loss += loss * len(xb)
            correct += int(np.count_nonzero((logit > 0) == (yb == 1)))
        n = max(len(x), 1)
        return total_loss / n, correct / n



def _logistic(logit: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean binary cross-entropy of labels ``y`` (0/1) and its gradient per example (unscaled)."""
    # log(1 + exp(-s*logit)) with s = +-1, computed without overflow.
    signed = np.where(y == 1, logit, -logit)
    loss = float(np.logaddexp(0, -signed).mean()) if len(y) else 0.0
    prob = 0.5 * (1.0 + np.tanh(0.5 * logit))  # sigmoid, overflow-free
    return loss, (prob - y).astype(logit.dtype)
