"""A one-hidden-layer perceptron (ReLU, softmax cross-entropy) on one flat parameter vector.

All parameters live in one float32 vector so a transport can cut it into index
ranges without knowing the model; ``layers`` says which range is which tensor.
Layout, in forward order, for ``num_features=D, hidden=H, num_classes=K``::

    fc1.weight (D, H)   offset 0
    fc1.bias   (H,)     offset D*H
    fc2.weight (H, K)   offset D*H + H
    fc2.bias   (K,)     offset D*H + H + H*K

Every method computes in the dtype of ``params`` (float32 in training; a gradient
check may pass float64).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tailcut.ml.models import Layer, check_params, layout, views

# Rows per forward pass in evaluate(): bounds the hidden activations' memory.
_EVAL_BATCH = 4096


class MLP:
    """Input -> hidden (ReLU) -> logits, trained with softmax cross-entropy."""

    name = "mlp"

    def __init__(self, num_features: int, num_classes: int, hidden: int = 64) -> None:
        self.num_features = num_features
        self.num_classes = num_classes
        self.hidden = hidden
        self.layers: tuple[Layer, ...] = layout(
            [
                ("fc1.weight", (num_features, hidden)),
                ("fc1.bias", (hidden,)),
                ("fc2.weight", (hidden, num_classes)),
                ("fc2.bias", (num_classes,)),
            ]
        )
        last = self.layers[-1]
        self.num_params = last.offset + last.size

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """He-initialised weights (ReLU keeps activations' scale), zero biases."""
        params = np.zeros(self.num_params, dtype=np.float32)
        w1, _, w2, _ = views(self.layers, params)
        w1[...] = rng.normal(0.0, np.sqrt(2.0 / self.num_features), w1.shape)
        w2[...] = rng.normal(0.0, np.sqrt(1.0 / self.hidden), w2.shape)
        return params

    def loss_and_grad(
        self, params: np.ndarray, x: np.ndarray, y: np.ndarray
    ) -> tuple[float, np.ndarray]:
        """Mean cross-entropy over the batch and its gradient, flat like ``params``."""
        check_params(params, self.num_params)
        w1, b1, w2, b2 = views(self.layers, params)
        x = x.astype(params.dtype, copy=False)
        pre = x @ w1 + b1
        hidden = np.maximum(pre, 0)
        logits = hidden @ w2 + b2
        loss, dlogits = _softmax_cross_entropy(logits, y)

        grad = np.empty_like(params)
        gw1, gb1, gw2, gb2 = views(self.layers, grad)
        gw2[...] = hidden.T @ dlogits
        gb2[...] = dlogits.sum(axis=0)
        dhidden = dlogits @ w2.T
        dhidden[pre <= 0] = 0
        gw1[...] = x.T @ dhidden
        gb1[...] = dhidden.sum(axis=0)
        return loss, grad

    # Layer-wise passes (tailcut.ml.layerwise): the dense layers as stages.
    @property
    def stages(self) -> tuple[tuple[int, int], ...]:
        return dense_stages(self.layers)

    def forward_stage(self, k: int, params: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, Any]:
        return dense_forward(self.layers, k, params, h)

    def loss_head(self, logits: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        return _softmax_cross_entropy(logits, y)

    def backward_stage(self, k: int, params: np.ndarray, cache: Any, delta: np.ndarray,
                       grad: np.ndarray) -> np.ndarray | None:
        return dense_backward(self.layers, k, params, cache, delta, grad)

    def evaluate(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """Mean cross-entropy and accuracy over all rows of ``x``."""
        check_params(params, self.num_params)
        w1, b1, w2, b2 = views(self.layers, params)
        total_loss = 0.0
        correct = 0
        for lo in range(0, len(x), _EVAL_BATCH):
            xb = x[lo : lo + _EVAL_BATCH].astype(params.dtype, copy=False)
            yb = y[lo : lo + _EVAL_BATCH]
            logits = np.maximum(xb @ w1 + b1, 0) @ w2 + b2
            loss, _ = _softmax_cross_entropy(logits, yb, need_grad=False)
            total_loss += loss * len(xb)
            correct += int(np.count_nonzero(logits.argmax(axis=1) == yb))
        n = max(len(x), 1)
        return total_loss / n, correct / n


def dense_stages(layers: Sequence[Layer]) -> tuple[tuple[int, int], ...]:
    """[lo, hi) of each (weight, bias) pair of a stack of dense layers."""
    return tuple((w.offset, b.offset + b.size) for w, b in zip(layers[0::2], layers[1::2]))


def _pair(layers: Sequence[Layer], k: int, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w, b = layers[2 * k], layers[2 * k + 1]
    return (flat[w.offset:w.offset + w.size].reshape(w.shape),
            flat[b.offset:b.offset + b.size].reshape(b.shape))


def dense_forward(layers: Sequence[Layer], k: int, params: np.ndarray,
                  h: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Dense layer k of a ReLU stack (the last one without ReLU); cache (input, pre)."""
    w, b = _pair(layers, k, params)
    if k == 0:
        h = h.astype(params.dtype, copy=False)
    pre = h @ w + b
    out = pre if 2 * k + 2 == len(layers) else np.maximum(pre, 0)
    return out, (h, pre)


def dense_backward(layers: Sequence[Layer], k: int, params: np.ndarray,
                   cache: tuple[np.ndarray, np.ndarray], delta: np.ndarray,
                   grad: np.ndarray) -> np.ndarray | None:
    """Write layer k's weight and bias gradient into ``grad`` given the loss's gradient
    w.r.t. its output; return the gradient w.r.t. its input (None for the first)."""
    h, pre = cache
    if 2 * k + 2 != len(layers):
        delta[pre <= 0] = 0  # through the ReLU (delta is the product made one stage up)
    gw, gb = _pair(layers, k, grad)
    gw[...] = h.T @ delta
    gb[...] = delta.sum(axis=0)
    if k == 0:
        return None
    d_in: np.ndarray = delta @ _pair(layers, k, params)[0].T
    return d_in


def _softmax_cross_entropy(
    logits: np.ndarray, y: np.ndarray, need_grad: bool = True
) -> tuple[float, np.ndarray]:
    """Mean cross-entropy of integer labels ``y``; gradient w.r.t. the logits."""
    shifted = logits - logits.max(axis=1, keepdims=True)  # avoids exp overflow
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    rows = np.arange(len(y))
    loss = float(-log_probs[rows, y].mean()) if len(y) else 0.0
    if not need_grad:
        return loss, logits[:0]
    dlogits = np.exp(log_probs)
    dlogits[rows, y] -= 1
    dlogits /= max(len(y), 1)
    return loss, dlogits
