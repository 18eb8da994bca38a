"""A perceptron with several hidden ReLU layers on one flat vector: a model whose later
layers are the big ones (as VGG's dense layers are), so the order tensors cross the
network in matters for when each one is usable.

Layout, in forward order, for ``num_features=D``, ``hidden=(H1, ..., Hn)``, ``K`` classes::

    fc1.weight (D, H1)  fc1.bias (H1,)  fc2.weight (H1, H2)  fc2.bias (H2,) ...  fc<n+1>.*

The registered ``deep-mlp`` uses hidden=(32, 512, 512): 316,714 parameters, of which
fc1.weight is 10% and fc3.weight (512 x 512) 83%. ``even-mlp`` uses ``EVEN_HIDDEN``
(256, 1024, 256): 784,394 parameters in three dense layers of 256-262k each and a small
head, so each layer takes about as long to send and to compute as the others (what
a layer-wise pipeline needs to show; the paper's models are that way too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tailcut.ml import mlp
from tailcut.ml.models import Layer, check_params, layout

_EVAL_BATCH = 4096
EVEN_HIDDEN = (256, 1024, 256)


class DeepMLP:
    """Input -> hidden ReLU layers -> logits, trained with softmax cross-entropy."""

    name = "deep-mlp"

    def __init__(self, num_features: int, num_classes: int,
                 hidden: Sequence[int] = (32, 512, 512), name: str = "deep-mlp") -> None:
        self.name = name
        widths = [num_features, *hidden, num_classes]
        shapes: list[tuple[str, tuple[int, ...]]] = []
        for i, (a, b) in enumerate(zip(widths, widths[1:]), start=1):
            shapes += [(f"fc{i}.weight", (a, b)), (f"fc{i}.bias", (b,))]
        self.layers: tuple[Layer, ...] = layout(shapes)
        self.num_params = self.layers[-1].offset + self.layers[-1].size

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """He-initialised weights (ReLU), zero biases."""
        params = np.zeros(self.num_params, dtype=np.float32)
        for w, _ in self._pairs(params):
            w[...] = rng.normal(0.0, np.sqrt(2.0 / w.shape[0]), w.shape)
        return params

    def loss_and_grad(self, params: np.ndarray, x: np.ndarray,
                      y: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean cross-entropy over the batch and its gradient, flat like ``params``."""
        check_params(params, self.num_params)
        pairs = self._pairs(params)
        acts = [x.astype(params.dtype, copy=False)]
        pres = []
        for i, (w, b) in enumerate(pairs):
            pre = acts[-1] @ w + b
            pres.append(pre)
            acts.append(pre if i == len(pairs) - 1 else np.maximum(pre, 0))
        loss, delta = mlp._softmax_cross_entropy(acts[-1], y)
        grad = np.empty_like(params)
        gpairs = self._pairs(grad)
        for i in range(len(pairs) - 1, -1, -1):
            gw, gb = gpairs[i]
            gw[...] = acts[i].T @ delta
            gb[...] = delta.sum(axis=0)
            if i:
                delta = delta @ pairs[i][0].T
                delta[pres[i - 1] <= 0] = 0
        return loss, grad

    # Layer-wise passes (tailcut.ml.layerwise): each dense layer is a stage.
    @property
    def stages(self) -> tuple[tuple[int, int], ...]:
        return mlp.dense_stages(self.layers)

    def forward_stage(self, k: int, params: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, Any]:
        return mlp.dense_forward(self.layers, k, params, h)

    def loss_head(self, logits: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        return mlp._softmax_cross_entropy(logits, y)

    def backward_stage(self, k: int, params: np.ndarray, cache: Any, delta: np.ndarray,
                       grad: np.ndarray) -> np.ndarray | None:
        return mlp.dense_backward(self.layers, k, params, cache, delta, grad)

    def evaluate(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """Mean cross-entropy and accuracy over all rows of ``x``."""
        check_params(params, self.num_params)
        pairs = self._pairs(params)
        total, correct = 0.0, 0
        for lo in range(0, len(x), _EVAL_BATCH):
            h = x[lo:lo + _EVAL_BATCH].astype(params.dtype, copy=False)
            for i, (w, b) in enumerate(pairs):
                h = h @ w + b
                if i < len(pairs) - 1:
                    h = np.maximum(h, 0)
            yb = y[lo:lo + _EVAL_BATCH]
            loss, _ = mlp._softmax_cross_entropy(h, yb, need_grad=False)
            total += loss * len(yb)
            correct += int(np.count_nonzero(h.argmax(axis=1) == yb))
        n = max(len(x), 1)
        return total / n, correct / n

    def _pairs(self, flat: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        views = [flat[l.offset:l.offset + l.size].reshape(l.shape) for l in self.layers]
        return list(zip(views[0::2], views[1::2]))
