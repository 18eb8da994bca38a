"""Tests of the sparse model: exact gradients with repeated ids, and Zipf-skewed click data."""

import numpy as np

from tailcut.ml import clicks, sparse
from tests.ml import gradcheck


def test_gradient_matches_central_finite_differences_with_repeated_ids() -> None:
    rng = np.random.default_rng(0)
    model = sparse.Sparse(num_features=11, fields=3, dim=2, hidden=4)
    params = model.init_params(rng).astype(np.float64) + rng.normal(0, 0.1, model.num_params)
    x = np.array([[0, 1, 2], [2, 2, 5], [10, 0, 1], [3, 4, 0], [0, 1, 2]])
    y = np.array([1, 0, 1, 0, 0])
    error, scale = gradcheck.max_gradient_error(model, params, x, y)
    assert scale > 0.01 and error < 1e-7


def test_only_the_rows_of_ids_in_the_batch_get_a_gradient() -> None:
    model = sparse.Sparse(num_features=50, fields=2, dim=3, hidden=4)
    params = model.init_params(np.random.default_rng(0))
    _, grad = model.loss_and_grad(params, np.array([[3, 7], [7, 9]]), np.array([1, 0]))
    emb = grad[: 50 * 3].reshape(50, 3)
    assert set(np.flatnonzero(np.abs(emb).sum(axis=1))) == {3, 7, 9}


def test_click_ids_follow_a_skewed_popularity() -> None:
    ds = clicks.make_click_dataset(0)
    counts = np.sort(np.bincount(ds.x_train.ravel(), minlength=ds.sizes["features"]))[::-1]
    # Hot ids: the top 1% of ids take over a third of all occurrences.
    assert counts[: len(counts) // 100].sum() > counts.sum() / 3
    assert 0.4 < ds.y_train.mean() < 0.6
