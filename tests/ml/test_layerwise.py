"""Layer-wise passes give the whole-model path's numbers, and call their hooks in order."""

import numpy as np
import pytest

from tailcut.ml import layerwise, models


def _case(name: str, rows: int = 48):
    dataset = models.dataset(name, 0)
    model = models.create(name, dataset)
    params = model.init_params(np.random.default_rng(0))
    # A trained-looking point, not the init: some ReLUs off, biases non-zero.
    params += np.random.default_rng(1).normal(0, 0.02, params.size).astype(np.float32)
    return model, params, dataset.x_train[:rows], dataset.y_train[:rows]


@pytest.mark.parametrize("name", ["deep-mlp", "mlp"])
def test_the_layerwise_gradient_and_loss_equal_the_whole_model_path(name):
    model, params, x, y = _case(name)
    loss, grad = model.loss_and_grad(params, x, y)
    lw_loss, lw_grad = layerwise.loss_and_grad(model, params, x, y)
    assert lw_grad.dtype == grad.dtype == np.float32
    np.testing.assert_allclose(lw_grad, grad, rtol=1e-6, atol=1e-8)
    assert lw_loss == pytest.approx(loss, rel=1e-7)


def test_the_layerwise_gradient_is_also_right_in_float64():
    model, params, x, y = _case("deep-mlp", rows=8)
    params = params.astype(np.float64)
    _, grad = model.loss_and_grad(params, x, y)
    _, lw_grad = layerwise.loss_and_grad(model, params, x, y)
    np.testing.assert_allclose(lw_grad, grad, rtol=1e-12, atol=1e-15)


def test_stages_cover_the_vector_in_forward_order_one_dense_layer_each():
    model, *_ = _case("deep-mlp")
    assert model.stages[0][0] == 0 and model.stages[-1][1] == model.num_params
    assert all(a[1] == b[0] for a, b in zip(model.stages, model.stages[1:]))
    assert len(model.stages) == 4
    assert layerwise.stage_of(model, model.layers[4].offset) == 2  # fc3.weight


def test_each_stage_waits_for_its_parameters_and_its_gradient_is_final_when_reported():
    model, params, x, y = _case("deep-mlp")
    _, whole = model.loss_and_grad(params, x, y)
    calls = []
    seen = {}

    def done(k, grad):
        lo, hi = model.stages[k]
        calls.append(("done", k))
        seen[k] = grad[lo:hi].copy()

    layerwise.loss_and_grad(model, params, x, y, ready=lambda k: calls.append(("ready", k)),
                            done=done)
    assert calls == [("ready", k) for k in range(4)] + [("done", k) for k in (3, 2, 1, 0)]
    for k, (lo, hi) in enumerate(model.stages):
        np.testing.assert_allclose(seen[k], whole[lo:hi], rtol=1e-6, atol=1e-8)


def test_a_stage_reads_only_its_own_range_so_later_layers_may_still_be_in_flight():
    model, params, x, y = _case("deep-mlp")
    _, whole = model.loss_and_grad(params, x, y)
    arriving = np.full_like(params, np.nan)  # NaN until "arrived"

    def ready(k):
        lo, hi = model.stages[k]
        arriving[lo:hi] = params[lo:hi]

    _, grad = layerwise.loss_and_grad(model, arriving, x, y, ready=ready)
    np.testing.assert_allclose(grad, whole, rtol=1e-6, atol=1e-8)


def test_models_without_stages_are_not_layerwise():
    assert layerwise.supports(_case("deep-mlp")[0]) and layerwise.supports(_case("mlp")[0])
    for name in ("cnn", "rnn", "mf", "sparse"):
        assert not layerwise.supports(models.create(name, models.dataset(name, 0)))
