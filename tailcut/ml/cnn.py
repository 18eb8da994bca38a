"""A small convolutional network (two conv + max-pool stages, two dense layers), numpy only.

Convolutions are 3x3, stride 1, zero padding 1, computed as one matrix product
per layer over an im2col view (``sliding_window_view``: no Python loop over
pixels), so a forward and backward pass of 32 12x12 images takes milliseconds.
Layout, in forward order, for ``C`` input channels, ``K`` classes::

    conv1.weight (F1, C*9)        conv1.bias (F1,)
    conv2.weight (F2, F1*9)       conv2.bias (F2,)
    fc1.weight   (F2*H/4*W/4, D)  fc1.bias   (D,)
    fc2.weight   (D, K)           fc2.bias   (K,)

Height and width must be divisible by 4 (two 2x2 poolings). Every method computes
in the dtype of ``params`` (float32 in training; a gradient check may pass float64).
"""

from __future__ import annotations

import numpy as np

from tailcut.ml import mlp
from tailcut.ml.models import Layer, check_params, layout, views

_EVAL_BATCH = 1024


class CNN:
    """conv3x3-ReLU-pool, conv3x3-ReLU-pool, dense-ReLU, dense; softmax cross-entropy."""

    name = "cnn"

    def __init__(
        self,
        channels: int,
        height: int,
        width: int,
        num_classes: int,
        filters: tuple[int, int] = (8, 16),
        dense: int = 64,
    ) -> None:
        if height % 4 or width % 4:
            raise ValueError(f"image {height}x{width}: height and width must be divisible by 4")
        self.channels, self.height, self.width = channels, height, width
        self.num_classes = num_classes
        f1, f2 = filters
        flat = f2 * (height // 4) * (width // 4)
        self.layers: tuple[Layer, ...] = layout(
            [
                ("conv1.weight", (f1, channels * 9)),
                ("conv1.bias", (f1,)),
                ("conv2.weight", (f2, f1 * 9)),
                ("conv2.bias", (f2,)),
                ("fc1.weight", (flat, dense)),
                ("fc1.bias", (dense,)),
                ("fc2.weight", (dense, num_classes)),
                ("fc2.bias", (num_classes,)),
            ]
        )
        last = self.layers[-1]
        self.num_params = last.offset + last.size

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """He-initialised weights (fan-in of each layer), zero biases."""
        params = np.zeros(self.num_params, dtype=np.float32)
        for layer, view in zip(self.layers, views(self.layers, params), strict=True):
            if layer.name.endswith("weight"):
                fan_in = layer.shape[1] if layer.name.startswith("conv") else layer.shape[0]
                view[...] = rng.normal(0.0, np.sqrt(2.0 / fan_in), layer.shape)
        return params

    def loss_and_grad(
        self, params: np.ndarray, x: np.ndarray, y: np.ndarray
    ) -> tuple[float, np.ndarray]:
        """Mean cross-entropy over the batch and its gradient, flat like ``params``."""
        check_params(params, self.num_params)
        w1, b1, w2, b2, w3, b3, w4, b4 = views(self.layers, params)
        x = x.astype(params.dtype, copy=False)
        n = len(x)
        cols1, a1 = _conv_forward(x, w1, b1)
        r1 = np.maximum(a1, 0)
        p1, arg1 = _pool_forward(r1)
        cols2, a2 = _conv_forward(p1, w2, b2)
        r2 = np.maximum(a2, 0)
        p2, arg2 = _pool_forward(r2)
        flat = p2.reshape(n, -1)
        h_pre = flat @ w3 + b3
        h = np.maximum(h_pre, 0)
        logits = h @ w4 + b4
        loss, dlogits = mlp._softmax_cross_entropy(logits, y)

        grad = np.empty_like(params)
        g1, gb1, g2, gb2, g3, gb3, g4, gb4 = views(self.layers, grad)
        g4[...] = h.T @ dlogits
        gb4[...] = dlogits.sum(axis=0)
        dh = dlogits @ w4.T
        dh[h_pre <= 0] = 0
        g3[...] = flat.T @ dh
        gb3[...] = dh.sum(axis=0)
        dp2 = (dh @ w3.T).reshape(p2.shape)
        dr2 = _pool_backward(dp2, arg2, r2.shape)
        dr2[a2 <= 0] = 0
        dp1 = _conv_backward(dr2, cols2, w2, g2, gb2, p1.shape)
        dr1 = _pool_backward(dp1, arg1, r1.shape)
        dr1[a1 <= 0] = 0
        _conv_backward(dr1, cols1, w1, g1, gb1, None)
        return loss, grad

    def evaluate(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """Mean cross-entropy and accuracy over all images in ``x``."""
        check_params(params, self.num_params)
        w1, b1, w2, b2, w3, b3, w4, b4 = views(self.layers, params)
        total_loss = 0.0
        correct = 0
        for lo in range(0, len(x), _EVAL_BATCH):
            xb = x[lo : lo + _EVAL_BATCH].astype(params.dtype, copy=False)
            yb = y[lo : lo + _EVAL_BATCH]
            p1, _ = _pool_forward(np.maximum(_conv_forward(xb, w1, b1)[1], 0))
            p2, _ = _pool_forward(np.maximum(_conv_forward(p1, w2, b2)[1], 0))
            logits = np.maximum(p2.reshape(len(xb), -1) @ w3 + b3, 0) @ w4 + b4
            loss, _ = mlp._softmax_cross_entropy(logits, yb, need_grad=False)
            total_loss += loss * len(xb)
            correct += int(np.count_nonzero(logits.argmax(axis=1) == yb))
        n = max(len(x), 1)
        return total_loss / n, correct / n



def _im2col(x: np.ndarray) -> np.ndarray:
    """(N, C, H, W) -> (N*H*W, C*9): each row is one output pixel's 3x3xC input patch."""
    n, c, h, w = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    # windows: (N, C, H, W, 3, 3) -> (N, H, W, C, 3, 3), flattened per pixel.
    return windows.transpose(0, 2, 3, 1, 4, 5).reshape(n * h * w, c * 9)


def _conv_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """3x3 same-padding convolution; returns (im2col matrix, output (N, F, H, W))."""
    n, _, h, width = x.shape
    cols = _im2col(x)
    out = cols @ w.T + b  # (N*H*W, F)
    return cols, out.reshape(n, h, width, -1).transpose(0, 3, 1, 2)


def _conv_backward(
    dout: np.ndarray,
    cols: np.ndarray,
    w: np.ndarray,
    gw: np.ndarray,
    gb: np.ndarray,
    input_shape: tuple[int, ...] | None,
) -> np.ndarray:
    """Fill ``gw``/``gb``; return the gradient w.r.t. the input (skipped if shape is None).

    The input gradient of a 3x3 same-padding convolution is itself one: the output
    gradient convolved with the kernel flipped in space and with input and output
    channels swapped, so it reuses ``_conv_forward`` (one im2col and one product).
    """
    n, f, h, width = dout.shape
    d2 = dout.transpose(0, 2, 3, 1).reshape(n * h * width, f)
    gw[...] = d2.T @ cols
    gb[...] = d2.sum(axis=0)
    if input_shape is None:
        return dout[:0]
    c = input_shape[1]
    flipped = w.reshape(f, c, 3, 3)[:, :, ::-1, ::-1].transpose(1, 0, 2, 3).reshape(c, f * 9)
    _, dx = _conv_forward(dout, flipped, np.zeros(c, dtype=dout.dtype))
    return dx


def _pool_forward(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """2x2 max pooling; returns (pooled, mask of the positions that hold their block's max).

    A block whose max is tied (in practice: all four ReLU outputs are 0) routes the
    gradient to every tied position; those are exactly the ones the ReLU's own
    gradient then zeroes, so the result is still the exact gradient.
    """
    n, c, h, w = x.shape
    blocks = x.reshape(n, c, h // 2, 2, w // 2, 2)
    pooled = blocks.max(axis=(3, 5))
    return pooled, blocks == pooled[:, :, :, None, :, None]


def _pool_backward(dout: np.ndarray, mask: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Route each pooled gradient to the position(s) that held the max."""
    routed: np.ndarray = (mask * dout[:, :, :, None, :, None]).reshape(shape)
    return routed
