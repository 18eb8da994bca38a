"""Tests of the CNN: exact gradients through conv, pooling and dense layers; layout; data."""

import numpy as np
import pytest

from tailcut.ml import cnn, images
from tests.ml import gradcheck


def test_gradient_matches_central_finite_differences_in_every_layer() -> None:
    rng = np.random.default_rng(0)
    model = cnn.CNN(channels=2, height=8, width=8, num_classes=3, filters=(2, 3), dense=4)
    params = model.init_params(rng).astype(np.float64) + rng.normal(0, 0.05, model.num_params)
    x = rng.normal(size=(3, 2, 8, 8))
    y = rng.integers(0, 3, 3)
    error, scale = gradcheck.max_gradient_error(model, params, x, y)
    assert scale > 0.01 and error < 1e-7


def test_convolution_by_im2col_equals_a_direct_sum_over_the_kernel() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 3, 4, 4))
    w = rng.normal(size=(5, 3 * 9))
    b = rng.normal(size=5)
    _, out = cnn._conv_forward(x, w, b)
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    kernel = w.reshape(5, 3, 3, 3)
    direct = np.zeros((2, 5, 4, 4))
    for i in range(4):
        for j in range(4):
            patch = padded[:, :, i : i + 3, j : j + 3]
            direct[:, :, i, j] = np.einsum("ncij,fcij->nf", patch, kernel) + b
    np.testing.assert_allclose(out, direct, rtol=1e-12)


def test_image_sides_not_divisible_by_four_are_refused() -> None:
    with pytest.raises(ValueError, match="divisible by 4"):
        cnn.CNN(channels=1, height=10, width=12, num_classes=2)


def test_shapes_dataset_is_deterministic_and_balanced_enough() -> None:
    ds = images.make_shapes_dataset(0)
    assert ds.x_train.shape == (6000, 1, 12, 12) and ds.x_train.dtype == np.float32
    counts = np.bincount(ds.y_train, minlength=ds.num_classes)
    assert counts.min() > 0.7 * counts.mean()
    np.testing.assert_array_equal(images.make_shapes_dataset(0).x_test, ds.x_test)
