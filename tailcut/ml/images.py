"""Generated small grey-scale images of simple shapes, for the CNN.

Nothing is downloaded. Each class is a shape drawn at a random position and size
on a ``size x size`` canvas with a random stroke intensity, then covered in
Gaussian pixel noise: bars (horizontal, vertical), diagonals (two directions), a
plus, a cross, a square outline, a filled block. Position varies, so a classifier
must detect local patterns wherever they are (what convolutions are for), and the
noise makes some small, faint shapes ambiguous, so accuracy climbs over epochs.

``x`` is float32 of shape (n, 1, size, size) (channels first), ``y`` int64 labels.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tailcut.ml import data

Canvas = np.ndarray


def _hbar(c: Canvas, r: int, col: int, s: int) -> None:
    c[r + s // 2, col : col + s] = 1


def _vbar(c: Canvas, r: int, col: int, s: int) -> None:
    c[r : r + s, col + s // 2] = 1


def _diag(c: Canvas, r: int, col: int, s: int) -> None:
    idx = np.arange(s)
    c[r + idx, col + idx] = 1


def _anti(c: Canvas, r: int, col: int, s: int) -> None:
    idx = np.arange(s)
    c[r + idx, col + s - 1 - idx] = 1


def _plus(c: Canvas, r: int, col: int, s: int) -> None:
    _hbar(c, r, col, s)
    _vbar(c, r, col, s)


def _cross(c: Canvas, r: int, col: int, s: int) -> None:
    _diag(c, r, col, s)
    _anti(c, r, col, s)


def _square(c: Canvas, r: int, col: int, s: int) -> None:
    c[r, col : col + s] = c[r + s - 1, col : col + s] = 1
    c[r : r + s, col] = c[r : r + s, col + s - 1] = 1


def _block(c: Canvas, r: int, col: int, s: int) -> None:
    c[r + 1 : r + s - 1, col + 1 : col + s - 1] = 1


SHAPES: tuple[Callable[[Canvas, int, int, int], None], ...] = (
    _hbar, _vbar, _diag, _anti, _plus, _cross, _square, _block,
)


def make_shapes_dataset(
    seed: int = 0,
    *,
    size: int = 12,
    num_train: int = 6000,
    num_test: int = 1500,
    noise: float = 0.3,
    min_shape: int = 4,
) -> data.Dataset:
    """Generate a deterministic image dataset with ``len(SHAPES)`` classes."""
    if not 3 <= min_shape <= size:
        raise ValueError(f"min_shape={min_shape}: must be in [3, size={size}]")
    rng = np.random.default_rng(seed)
    n = num_train + num_test
    labels = rng.integers(0, len(SHAPES), n)
    images = np.zeros((n, size, size), dtype=np.float32)
    sizes = rng.integers(min_shape, size + 1, n)
    for i in range(n):
        s = int(sizes[i])
        r, col = rng.integers(0, size - s + 1, 2)
        SHAPES[labels[i]](images[i], int(r), int(col), s)
    images *= rng.uniform(0.5, 1.0, (n, 1, 1)).astype(np.float32)  # stroke intensity
    images += rng.normal(0.0, noise, images.shape).astype(np.float32)
    x = images[:, None, :, :]
    y = labels.astype(np.int64)
    return data.Dataset(
        x_train=x[:num_train],
        y_train=y[:num_train],
        x_test=x[num_train:],
        y_test=y[num_train:],
        num_classes=len(SHAPES),
        sizes={"height": size, "width": size, "channels": 1},
    )
