"""Tests of the model registry."""

import numpy as np
import pytest

from tailcut.training import models


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
    with pytest.raises(ValueError, match="supported: deep-mlp, mlp"):
        models.create("resnet", models.dataset("mlp", 0))


def test_layout_places_tensors_back_to_back() -> None:
    layers = models.layout([("a", (2, 3)), ("b", (4,))])
    assert [(layer.name, layer.offset, layer.size) for layer in layers] == [
        ("a", 0, 6),
        ("b", 6, 4),
    ]
