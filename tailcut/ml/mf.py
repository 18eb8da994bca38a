"""Matrix factorisation (biased, rank k) trained by SGD on squared error, one flat vector.

A rating is predicted as ``mu + b_user + b_item + P[user] . Q[item]``, where ``mu``
is the mean training rating, a constant of the model rather than a parameter: a
learned global bias sits in every example's gradient, so plain SGD would have to
keep its step below 2 for that one coordinate and the rarely rated items' rows
would barely move. Layout, in forward order, for ``U`` users, ``I`` items and rank
``k``::

    user.embedding (U, k)   offset 0
    item.embedding (I, k)   offset U*k
    user.bias      (U,)     offset (U+I)*k
    item.bias      (I,)     offset (U+I)*k + U

The loss of a batch is the mean of ``0.5 * (prediction - stars)^2`` plus an L2
penalty ``0.5 * l2 * (|P[user]|^2 + |Q[item]|^2)`` on the rows each rating touches
(the usual SGD-for-MF regulariser: a rarely rated item is not shrunk every step).
"Accuracy" is the share of ratings whose prediction, clipped to 1..5, is within
half a star of the truth, i.e. rounds to the right number of stars.
"""

from __future__ import annotations

import numpy as np

from tailcut.ml.models import Layer, check_params, layout, views

class MF:
    """Biased matrix factorisation of a (users x items) ratings matrix."""

    name = "mf"

    def __init__(
        self, num_users: int, num_items: int, mean: float, rank: int = 8, l2: float = 0.05
    ) -> None:
        self.mean = mean
        self.num_users = num_users
        self.num_items = num_items
        self.rank = rank
        self.l2 = l2
        self.layers: tuple[Layer, ...] = layout(
            [
                ("user.embedding", (num_users, rank)),
                ("item.embedding", (num_items, rank)),
                ("user.bias", (num_users,)),
                ("item.bias", (num_items,)),
            ]
        )
        last = self.layers[-1]
        self.num_params = last.offset + last.size

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """Small random embeddings (not zero: P.Q needs both to be non-zero to learn)."""
        params = np.zeros(self.num_params, dtype=np.float32)
        p, q, _, _ = views(self.layers, params)
        p[...] = rng.normal(0.0, 0.1, p.shape)
        q[...] = rng.normal(0.0, 0.1, q.shape)
        return params

    def loss_and_grad(
        self, params: np.ndarray, x: np.ndarray, y: np.ndarray
    ) -> tuple[float, np.ndarray]:
        """Mean regularised squared error of the batch and its gradient, flat like ``params``."""
        check_params(params, self.num_params)
        p, q, bu, bi = views(self.layers, params)
        users, items = x[:, 0], x[:, 1]
        pu, qi = p[users], q[items]
        pred = self.mean + bu[users] + bi[items] + np.einsum("nk,nk->n", pu, qi)
        err = pred - y.astype(params.dtype)
        n = max(len(y), 1)
        loss = 0.5 * float(err @ err) + 0.5 * self.l2 * float((pu * pu).sum() + (qi * qi).sum())

        grad = np.zeros_like(params)
        gp, gq, gbu, gbi = views(self.layers, grad)
        e = err[:, None]
        np.add.at(gp, users, e * qi + self.l2 * pu)
        np.add.at(gq, items, e * pu + self.l2 * qi)
        np.add.at(gbu, users, err)
        np.add.at(gbi, items, err)
        grad /= n
        return loss / n, grad

    def predict(self, params: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Predicted stars (not clipped) for (user, item) rows ``x``."""
        p, q, bu, bi = views(self.layers, params)
        users, items = x[:, 0], x[:, 1]
        return np.asarray(
            self.mean + bu[users] + bi[items] + np.einsum("nk,nk->n", p[users], q[items])
        )

    def evaluate(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """The training objective and the share of ratings predicted within half a star."""
        check_params(params, self.num_params)
        loss = self._loss_only(params, x, y)
        pred = np.clip(self.predict(params, x), 1.0, 5.0)
        close = np.abs(pred - y) < 0.5
        return loss, float(close.mean()) if len(y) else 0.0

    def _loss_only(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
        p, q, _, _ = views(self.layers, params)
        err = self.predict(params, x) - y.astype(params.dtype)
        pu, qi = p[x[:, 0]], q[x[:, 1]]
        loss = 0.5 * float(err @ err) + 0.5 * self.l2 * float((pu * pu).sum() + (qi * qi).sum())
        return loss / max(len(y), 1)
