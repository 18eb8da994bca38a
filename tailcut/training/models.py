"""The model interface every role trains through, and the registry of named models.

A model keeps all its parameters in ONE flat float32 vector; ``layers`` names the
index range of each tensor in forward order, so transports and flow tags can cut
the vector by range without knowing the model. Each registry entry pairs a model
with the data it trains on, because a model's shape follows from its data (an MLP's
input width is the vocabulary size; a later matrix-factorisation model's is the
number of users and items).

    dataset = models.dataset("mlp", seed=0)
    model = models.create("mlp", dataset)
    params = model.init_params(np.random.default_rng(0))
    loss, grad = model.loss_and_grad(params, x, y)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tailcut.training import data


@dataclass(frozen=True)
class Layer:
    """One tensor of a model: its name, shape and offset in the flat vector."""

    name: str
    shape: tuple[int, ...]
    offset: int

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def layout(shapes: Sequence[tuple[str, tuple[int, ...]]]) -> tuple[Layer, ...]:
    """Place named tensors back to back, in the given (forward) order."""
    layers = []
    offset = 0
    for name, shape in shapes:
        layer = Layer(name, tuple(shape), offset)
        layers.append(layer)
        offset += layer.size
    return tuple(layers)


class Model(Protocol):
    """What the PS and workers need from a model."""

    name: str
    num_params: int
    layers: tuple[Layer, ...]

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """A fresh float32 vector of ``num_params`` initial values."""
        ...

    def loss_and_grad(
        self, params: np.ndarray, x: np.ndarray, y: np.ndarray
    ) -> tuple[float, np.ndarray]:
        """Mean loss over the batch and its gradient (flat, same length and dtype)."""
        ...

    def evaluate(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """(mean loss, accuracy) over the given examples."""
        ...


@dataclass(frozen=True)
class Entry:
    """A registered model: how to make its data and how to build it for that data."""

    make_dataset: Callable[[int], data.Dataset]
    build: Callable[[data.Dataset], Model]


def _build_mlp(dataset: data.Dataset) -> Model:
    from tailcut.training import mlp  # here, not at the top: mlp imports Layer from us

    return mlp.MLP(dataset.num_features, dataset.num_classes)


def _build_deep_mlp(dataset: data.Dataset) -> Model:
    from tailcut.training import deep_mlp

    return deep_mlp.DeepMLP(dataset.num_features, dataset.num_classes)


_REGISTRY: dict[str, Entry] = {
    "mlp": Entry(make_dataset=lambda seed: data.make_text_dataset(seed), build=_build_mlp),
    "deep-mlp": Entry(make_dataset=lambda seed: data.make_text_dataset(seed),
                      build=_build_deep_mlp),
}


def names() -> list[str]:
    """Names of the registered models, sorted."""
    return sorted(_REGISTRY)


def _entry(name: str) -> Entry:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"model {name!r} is unknown; supported: {', '.join(names())}") from None


def dataset(name: str, seed: int) -> data.Dataset:
    """The (generated, deterministic) dataset model ``name`` trains on."""
    return _entry(name).make_dataset(seed)


def create(name: str, dataset: data.Dataset) -> Model:
    """Build model ``name`` sized for ``dataset``."""
    return _entry(name).build(dataset)
