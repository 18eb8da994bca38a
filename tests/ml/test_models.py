"""Tests of the model registry."""

import numpy as np
import pytest

from tailcut.ml import models


def test_mlp_is_registered_and_sized_for_its_dataset() -> None:
    assert "mlp" in models.names()
    ds = models.dataset("mlp", seed=0)
    model = models.create("mlp", ds)
    params = model.init_params(np.random.default_rng(0))
    assert params.dtype == np.float32 and params.shape == (model.num_params,)
    assert model.layers[0].shape[0] == ds.num_features
    assert model.layers[-1].shape == (ds.num_classes,)
    # A few hundred KB on the wire: big enough for transports to matter.
    assert 100_000 < params.nbytes < 1_000_000


def test_an_unknown_model_name_lists_the_supported_ones() -> None:
    with pytest.raises(ValueError, match="supported: cnn, deep-mlp, even-mlp, mf, mlp, rnn, sparse"):
        models.create("resnet", models.dataset("mlp", 0))


def test_layout_places_tensors_back_to_back() -> None:
    layers = models.layout([("a", (2, 3)), ("b", (4,))])
    assert [(layer.name, layer.offset, layer.size) for layer in layers] == [
        ("a", 0, 6),
        ("b", 6, 4),
    ]


@pytest.mark.parametrize("name", models.names())
def test_every_model_tiles_its_flat_vector_and_states_its_settings(name: str) -> None:
    ds = models.dataset(name, seed=0)
    model = models.create(name, ds)
    offset = 0
    for layer in model.layers:
        assert layer.offset == offset
        offset += layer.size
    assert offset == model.num_params
    params = model.init_params(np.random.default_rng(0))
    assert params.dtype == np.float32 and params.shape == (model.num_params,)
    # Many packets per message, so losing ranges of 350 floats is a fine-grained loss.
    assert model.num_params > 20 * 350
    loss, grad = model.loss_and_grad(params, ds.x_train[:8], ds.y_train[:8])
    assert grad.dtype == np.float32 and np.isfinite(loss) and np.abs(grad).max() > 0
    entry = models.info(name)
    assert entry.data and 0 < entry.target_accuracy < 1 and entry.learning_rate > 0
    # The target is not met by the initial parameters.
    assert model.evaluate(params, ds.x_test, ds.y_test)[1] < entry.target_accuracy


def test_a_dataset_loaded_ahead_is_taken_by_the_next_call_only() -> None:
    """A role forked ahead (tailcut.runtime.rolefork) loads its dataset while the
    network is built; the role's own call takes that copy, any later call its own."""
    models.load_ahead("mlp", 0)
    ahead = models._loaded_ahead[("mlp", 0)]
    first, second = models.dataset("mlp", 0), models.dataset("mlp", 0)
    assert first is ahead and second is not ahead
    assert np.array_equal(second.x_train, ahead.x_train)
    assert ("mlp", 0) not in models._loaded_ahead
