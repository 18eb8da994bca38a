"""Tests of the MLP: layout of the flat vector, exact gradients, and that SGD learns."""

import numpy as np
import pytest

from tailcut.ml import data, mlp


def _small_problem(seed: int = 0) -> tuple[mlp.MLP, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    model = mlp.MLP(num_features=7, num_classes=4, hidden=5)
    x = rng.normal(size=(6, 7))
    y = rng.integers(0, 4, size=6)
    return model, x, y


def test_layers_tile_the_flat_vector_in_forward_order() -> None:
    model = mlp.MLP(num_features=1000, num_classes=10, hidden=64)
    assert [layer.name for layer in model.layers] == [
        "fc1.weight",
        "fc1.bias",
        "fc2.weight",
        "fc2.bias",
    ]
    offset = 0
    for layer in model.layers:
        assert layer.offset == offset
        offset += layer.size
    assert offset == model.num_params == 1000 * 64 + 64 + 64 * 10 + 10


def test_gradient_matches_central_finite_differences_in_every_layer() -> None:
    model, x, y = _small_problem()
    params = model.init_params(np.random.default_rng(1)).astype(np.float64)
    params += np.random.default_rng(2).normal(0, 0.1, params.size)  # non-zero biases too
    _, grad = model.loss_and_grad(params, x, y)
    assert grad.dtype == np.float64 and grad.shape == params.shape
    eps = 1e-6
    for i in range(model.num_params):
        step = np.zeros_like(params)
        step[i] = eps
        up, _ = model.loss_and_grad(params + step, x, y)
        down, _ = model.loss_and_grad(params - step, x, y)
        assert grad[i] == pytest.approx((up - down) / (2 * eps), abs=1e-7, rel=1e-5), i


def test_float32_parameters_give_a_float32_gradient() -> None:
    model, x, y = _small_problem()
    params = model.init_params(np.random.default_rng(0))
    loss, grad = model.loss_and_grad(params, x.astype(np.float32), y)
    assert params.dtype == grad.dtype == np.float32
    assert np.isfinite(loss)


def test_evaluate_agrees_with_the_training_loss_and_counts_correct_predictions() -> None:
    model, x, y = _small_problem()
    params = model.init_params(np.random.default_rng(0)).astype(np.float64)
    loss, _ = model.loss_and_grad(params, x, y)
    eval_loss, accuracy = model.evaluate(params, x, y)
    assert eval_loss == pytest.approx(loss)
    # Force the prediction: a huge bias on class 2 makes every answer 2.
    params[model.layers[-1].offset + 2] = 1e3
    _, accuracy = model.evaluate(params, x, y)
    assert accuracy == pytest.approx(np.mean(y == 2))


def test_parameters_of_the_wrong_length_are_rejected() -> None:
    model, x, y = _small_problem()
    with pytest.raises(ValueError, match="shape"):
        model.loss_and_grad(np.zeros(model.num_params + 1), x, y)


def test_sgd_in_one_process_reaches_ninety_percent_test_accuracy_in_four_epochs() -> None:
    ds = data.make_text_dataset(0)
    model = mlp.MLP(ds.num_features, ds.num_classes)
    rng = np.random.default_rng(0)
    params = model.init_params(rng)
    for _ in range(4):
        order = rng.permutation(len(ds.x_train))
        for lo in range(0, len(order), 128):
            rows = order[lo : lo + 128]
            _, grad = model.loss_and_grad(params, ds.x_train[rows], ds.y_train[rows])
            params -= np.float32(0.3) * grad
    loss, accuracy = model.evaluate(params, ds.x_test, ds.y_test)
    assert accuracy >= 0.9
    # ...but the task is not trivial: the test set is not learned perfectly.
    assert accuracy < 0.99 and loss > 0.05
