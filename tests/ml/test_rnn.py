"""Tests of the RNN: exact BPTT gradients, ignored positions, the translation data."""

import numpy as np
import pytest

from tailcut.ml import rnn, sequences
from tests.ml import gradcheck


def test_bptt_gradient_matches_central_finite_differences() -> None:
    rng = np.random.default_rng(0)
    model = rnn.RNN(vocab=5, num_classes=4, hidden=3)
    params = model.init_params(rng).astype(np.float64) + rng.normal(0, 0.1, model.num_params)
    x = rng.integers(0, 5, (3, 6))
    y = rng.integers(0, 4, (3, 6))
    y[:, :2] = sequences.IGNORE
    error, scale = gradcheck.max_gradient_error(model, params, x, y)
    assert scale > 0.01 and error < 1e-7


def test_ignored_positions_change_neither_loss_nor_accuracy() -> None:
    rng = np.random.default_rng(1)
    model = rnn.RNN(vocab=5, num_classes=4, hidden=3)
    params = model.init_params(rng).astype(np.float64)
    x = rng.integers(0, 5, (4, 6))
    y = rng.integers(0, 4, (4, 6))
    y[:, :2] = sequences.IGNORE
    other = y.copy()
    loss, grad = model.loss_and_grad(params, x, y)
    assert model.evaluate(params, x, other) == pytest.approx(model.evaluate(params, x, y))
    assert model.evaluate(params, x, y)[0] == pytest.approx(loss)
    assert np.isfinite(grad).all()


def test_targets_are_the_dictionary_translation_of_the_word_three_steps_back() -> None:
    ds = sequences.make_translation_dataset(0, noise=0.0)
    x, y = ds.x_train, ds.y_train
    assert (y[:, :3] == sequences.IGNORE).all()
    # One dictionary: the same source word always maps to the same target word.
    pairs = set(zip(x[:, :-3].ravel().tolist(), y[:, 3:].ravel().tolist()))
    assert len(pairs) == ds.sizes["vocab"] == len({a for a, _ in pairs})
