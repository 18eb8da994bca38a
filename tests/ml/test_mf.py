"""Tests of matrix factorisation: layout, exact gradients, the half-star metric, and learning."""

import numpy as np
import pytest

from tailcut.ml import mf, ratings
from tests.ml import gradcheck


def _small(seed: int = 0) -> tuple[mf.MF, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    model = mf.MF(num_users=5, num_items=7, mean=3.2, rank=3, l2=0.1)
    params = model.init_params(rng).astype(np.float64) + rng.normal(0, 0.1, model.num_params)
    # Repeated users and items: their gradient rows must accumulate, not overwrite.
    x = np.array([[0, 1], [0, 2], [4, 1], [3, 6], [0, 1], [2, 0]])
    y = rng.integers(1, 6, len(x)).astype(np.float32)
    return model, params, x, y


def test_layers_are_user_and_item_embeddings_then_biases() -> None:
    model = mf.MF(num_users=400, num_items=800, mean=3.5, rank=8)
    assert [(layer.name, layer.shape) for layer in model.layers] == [
        ("user.embedding", (400, 8)),
        ("item.embedding", (800, 8)),
        ("user.bias", (400,)),
        ("item.bias", (800,)),
    ]
    assert model.num_params == 1200 * 8 + 1200


def test_gradient_matches_central_finite_differences_with_repeated_rows() -> None:
    model, params, x, y = _small()
    error, scale = gradcheck.max_gradient_error(model, params, x, y)
    assert scale > 0.01 and error < 1e-7


def test_accuracy_counts_ratings_predicted_within_half_a_star_after_clipping() -> None:
    model = mf.MF(num_users=1, num_items=3, mean=3.0, rank=1)
    params = np.zeros(model.num_params)
    params[model.layers[3].offset : model.layers[3].offset + 3] = [0.4, -0.6, 9.0]
    x = np.array([[0, 0], [0, 1], [0, 2]])
    # predictions 3.4 (rounds to 3: right), 2.4 (rounds to 2, truth 3: wrong), 12 -> 5 (right)
    _, accuracy = model.evaluate(params, x, np.array([3.0, 3.0, 5.0], dtype=np.float32))
    assert accuracy == pytest.approx(2 / 3)


def test_ratings_have_skewed_item_popularity_and_disjoint_train_and_test_pairs() -> None:
    ds = ratings.make_ratings_dataset(0)
    counts = np.bincount(ds.x_train[:, 1], minlength=ds.sizes["items"])
    top = np.sort(counts)[::-1]
    assert top[:80].sum() > 0.35 * counts.sum()  # top 10% of items: over a third
    assert top[0] > 10 * np.median(counts)  # a blockbuster is rated 10x a median item
    pairs = lambda x: set(map(tuple, x.tolist()))  # noqa: E731
    assert not pairs(ds.x_train) & pairs(ds.x_test)
    assert set(np.unique(ds.y_train)) <= {1.0, 2.0, 3.0, 4.0, 5.0}
    np.testing.assert_array_equal(ratings.make_ratings_dataset(0).x_train, ds.x_train)
