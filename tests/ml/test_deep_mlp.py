"""The deep-mlp model: layout, gradient, and that it learns."""

import numpy as np

from tailcut.ml import deep_mlp, models


def test_layers_are_back_to_back_in_forward_order_with_the_big_one_third():
    model = deep_mlp.DeepMLP(1000, 10)
    assert [layer.name for layer in model.layers] == [
        f"fc{i}.{p}" for i in range(1, 5) for p in ("weight", "bias")]
    assert model.num_params == 316_714
    big = max(model.layers, key=lambda layer: layer.size)
    assert big.name == "fc3.weight" and big.size / model.num_params > 0.8


def test_the_gradient_matches_finite_differences():
    model = deep_mlp.DeepMLP(6, 3, hidden=(5, 4))
    rng = np.random.default_rng(0)
    params = model.init_params(rng).astype(np.float64) + rng.normal(0, 0.1, model.num_params)
    x, y = rng.normal(size=(7, 6)), rng.integers(0, 3, 7)
    _, grad = model.loss_and_grad(params, x, y)
    eps = 1e-6
    for i in range(model.num_params):
        e = np.zeros_like(params)
        e[i] = eps
        numeric = (model.loss_and_grad(params + e, x, y)[0]
                   - model.loss_and_grad(params - e, x, y)[0]) / (2 * eps)
        assert abs(numeric - grad[i]) < 1e-5, i


def test_sgd_on_the_text_dataset_beats_chance_by_far():
    dataset = models.dataset("deep-mlp", 0)
    model = models.create("deep-mlp", dataset)
    params = model.init_params(np.random.default_rng(0))
    rng = np.random.default_rng(1)
    for _ in range(300):
        rows = rng.integers(0, len(dataset.x_train), 64)
        _, grad = model.loss_and_grad(params, dataset.x_train[rows], dataset.y_train[rows])
        params -= 0.1 * grad
    assert model.evaluate(params, dataset.x_test, dataset.y_test)[1] > 0.8
