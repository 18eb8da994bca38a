"""Built-in PyTorch models: the numpy MLP and CNN again, as ``nn.Module``\\s on the same data.

``torch-mlp`` and ``torch-cnn`` (tailcut.ml.models' registry) are these factories
behind the torch contract of tailcut.ml.torchmodel. Each starts from exactly the
numpy model's initial parameters for the same seed (torch's own layouts: a Linear
weight is the numpy weight transposed; a conv weight and the flatten before the
first dense layer already agree), so a torch job and its numpy twin can be set side
by side: same data, same start, same arithmetic up to float32 rounding.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tailcut.ml import cnn as np_cnn
from tailcut.ml import data, images
from tailcut.ml import mlp as np_mlp
from tailcut.ml import torchmodel
from tailcut.ml.models import views


def _set_from(module: Any, numpy_layers: Any, numpy_params: np.ndarray) -> None:
    """Copy a numpy model's parameters into ``module`` (same order), transposing the
    dense weights, whose numpy layout is (in, out)."""
    torch = torchmodel.require()
    with torch.no_grad():
        for (_, p), layer, value in zip(module.named_parameters(), numpy_layers,
                                        views(numpy_layers, numpy_params), strict=True):
            if layer.name.startswith("fc") and layer.name.endswith("weight"):
                value = value.T
            p.copy_(torchmodel.to_tensor(np.ascontiguousarray(value)).reshape(p.shape))


def mlp(seed: int) -> tuple[Any, Any, data.Dataset]:
    """The quickstart's MLP (input, 64 ReLU, 10) on the bag-of-words documents."""
    torch = torchmodel.require()
    nn = torch.nn
    dataset = data.make_text_dataset(seed)
    twin = np_mlp.MLP(dataset.num_features, dataset.num_classes)
    module = nn.Sequential()
    module.add_module("fc1", nn.Linear(twin.num_features, twin.hidden))
    module.add_module("relu", nn.ReLU())
    module.add_module("fc2", nn.Linear(twin.hidden, twin.num_classes))
    _set_from(module, twin.layers, twin.init_params(np.random.default_rng(seed)))
    return module, nn.CrossEntropyLoss(), dataset


def cnn(seed: int) -> tuple[Any, Any, data.Dataset]:
    """The CNN (conv 8, pool, conv 16, pool, dense 64, 8 classes) on the shape images."""
    torch = torchmodel.require()
    nn = torch.nn
    dataset = images.make_shapes_dataset(seed)
    s = dataset.sizes
    twin = np_cnn.CNN(s["channels"], s["height"], s["width"], dataset.num_classes)
    f1, f2 = twin.layers[0].shape[0], twin.layers[2].shape[0]
    flat, dense = twin.layers[4].shape
    module = nn.Sequential()
    module.add_module("conv1", nn.Conv2d(s["channels"], f1, 3, padding=1))
    module.add_module("relu1", nn.ReLU())
    module.add_module("pool1", nn.MaxPool2d(2))
    module.add_module("conv2", nn.Conv2d(f1, f2, 3, padding=1))
    module.add_module("relu2", nn.ReLU())
    module.add_module("pool2", nn.MaxPool2d(2))
    module.add_module("flatten", nn.Flatten())
    module.add_module("fc1", nn.Linear(flat, dense))
    module.add_module("relu3", nn.ReLU())
    module.add_module("fc2", nn.Linear(dense, dataset.num_classes))
    _set_from(module, twin.layers, twin.init_params(np.random.default_rng(seed)))
    return module, nn.CrossEntropyLoss(), dataset
