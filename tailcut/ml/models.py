"""The model interface every role trains through, and the registry of named models.

A model keeps all its parameters in ONE flat float32 vector; ``layers`` names the
index range of each tensor in forward order, so transports and flow tags can cut
the vector by range without knowing the model. Each registry entry pairs a model
with the data it trains on, because a model's shape follows from its data (an MLP's
input width is the vocabulary size; matrix factorisation's is the number of users
and items), and with the settings and target it converges with.

    mlp     text-like classification (data.py)          mf      ratings (ratings.py)
    cnn     small images (images.py)                     rnn     toy translation (sequences.py)
    sparse  Zipf-popular sparse ids, clicks (clicks.py)
    deep-mlp, even-mlp  deeper perceptrons on the mlp's documents (deep_mlp.py)
    torch-mlp, torch-cnn  the mlp and cnn as PyTorch modules (torchzoo.py; need torch)
    torch:<module>  a user's PyTorch factory, "pkg.mod:factory" (torchmodel.py)

    dataset = models.dataset("mlp", seed=0)
    model = models.create("mlp", dataset)
    params = model.init_params(np.random.default_rng(0))
    loss, grad = model.loss_and_grad(params, x, y)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tailcut.ml import data


@dataclass(frozen=True)
class Layer:
    """One tensor of a model: its name, shape and offset in the flat vector."""

    name: str
    shape: tuple[int, ...]
    offset: int

    @property
    def size(self) -> int:
        # math.prod, not np.prod: every message's flow rows and every step's views ask
        # for it, and numpy's reduction costs 40x more on a tuple this short (10 us)
        return int(math.prod(self.shape))


def layout(shapes: Sequence[tuple[str, tuple[int, ...]]]) -> tuple[Layer, ...]:
    """Place named tensors back to back, in the given (forward) order."""
    layers = []
    offset = 0
    for name, shape in shapes:
        layer = Layer(name, tuple(shape), offset)
        layers.append(layer)
        offset += layer.size
    return tuple(layers)


def views(layers: Sequence[Layer], flat: np.ndarray) -> list[np.ndarray]:
    """Each layer's tensor as a view into the flat vector (no copy)."""
    return [flat[layer.offset : layer.offset + layer.size].reshape(layer.shape)
            for layer in layers]


def check_params(params: np.ndarray, num_params: int) -> None:
    """Refuse a parameter vector of the wrong shape before any model reads it."""
    if params.shape != (num_params,):
        raise ValueError(f"params has shape {params.shape}, expected ({num_params},)")


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
    """A registered model: its data, how to build it, and the settings it converges with.

    ``target_accuracy`` is what "converged" means for this model: BSP SGD with
    ``learning_rate`` and ``batch_size`` (per worker, 4 workers, tcp, no loss)
    reaches it well within ``max_epochs``. ``metric`` says what the model's
    "accuracy" is, since not every model classifies.
    """

    make_dataset: Callable[[int], data.Dataset]
    build: Callable[[data.Dataset], Model]
    data: str = ""  # one line: what the generated data is
    metric: str = "test accuracy"
    target_accuracy: float = 0.9
    learning_rate: float = 0.1
    batch_size: int = 32
    max_epochs: int = 20


# Model modules import Layer from this module, so each builder imports its module
# when called rather than at the top.


def _build_mlp(dataset: data.Dataset) -> Model:
    from tailcut.ml import mlp

    return mlp.MLP(dataset.num_features, dataset.num_classes)


def _build_mf(dataset: data.Dataset) -> Model:
    from tailcut.ml import mf

    return mf.MF(dataset.sizes["users"], dataset.sizes["items"], float(dataset.y_train.mean()))


def _build_cnn(dataset: data.Dataset) -> Model:
    from tailcut.ml import cnn

    s = dataset.sizes
    return cnn.CNN(s["channels"], s["height"], s["width"], dataset.num_classes)


def _build_rnn(dataset: data.Dataset) -> Model:
    from tailcut.ml import rnn

    return rnn.RNN(dataset.sizes["vocab"], dataset.num_classes)


def _build_sparse(dataset: data.Dataset) -> Model:
    from tailcut.ml import sparse

    return sparse.Sparse(dataset.sizes["features"], dataset.sizes["fields"])


def _ratings(seed: int) -> data.Dataset:
    from tailcut.ml import ratings

    return ratings.make_ratings_dataset(seed)


def _images(seed: int) -> data.Dataset:
    from tailcut.ml import images

    return images.make_shapes_dataset(seed)


def _sequences(seed: int) -> data.Dataset:
    from tailcut.ml import sequences

    return sequences.make_translation_dataset(seed)


def _clicks(seed: int) -> data.Dataset:
    from tailcut.ml import clicks

    return clicks.make_click_dataset(seed)


def _build_deep_mlp(dataset: data.Dataset) -> Model:
    from tailcut.ml import deep_mlp

    return deep_mlp.DeepMLP(dataset.num_features, dataset.num_classes)


def _build_even_mlp(dataset: data.Dataset) -> Model:
    from tailcut.ml import deep_mlp

    return deep_mlp.DeepMLP(dataset.num_features, dataset.num_classes,
                            hidden=deep_mlp.EVEN_HIDDEN, name="even-mlp")


# A PyTorch factory makes the module and its data together: the data set remembers
# the model made with it, for build() (kept alive together, so ids stay unique).
_torch_made: dict[int, tuple[data.Dataset, Model]] = {}
TORCH_PREFIX = "torch:"


def _torch_dataset(ref: str) -> Callable[[int], data.Dataset]:
    def make(seed: int) -> data.Dataset:
        from tailcut.ml import torchmodel

        model, dataset = torchmodel.build(ref, seed)
        _torch_made[id(dataset)] = (dataset, model)
        return dataset
    return make


def _torch_build(dataset: data.Dataset) -> Model:
    try:
        return _torch_made[id(dataset)][1]
    except KeyError:
        raise ValueError("a torch model is built with its own data set: pass the one "
                         "models.dataset() returned") from None


# Targets sit a little below each model's plateau, so "converged" is reached in a
# few epochs with 4 workers and does not hinge on the noise of the last decimal.
_REGISTRY: dict[str, Entry] = {
    "mlp": Entry(
        make_dataset=lambda seed: data.make_text_dataset(seed),
        build=_build_mlp,
        data="bag-of-words documents, 10 topics, 1000-word vocabulary, 8000 train",
        target_accuracy=0.9,
        learning_rate=0.3,
        batch_size=32,
        max_epochs=20,
    ),
    "mf": Entry(
        make_dataset=_ratings,
        build=_build_mf,
        data="1-5 star ratings, 400 users x 800 items, Zipf(0.9) item popularity",
        metric="share of test ratings predicted within half a star",
        target_accuracy=0.67,
        learning_rate=10.0,
        batch_size=64,
        max_epochs=30,
    ),
    "cnn": Entry(
        make_dataset=_images,
        build=_build_cnn,
        data="12x12 noisy grey images of 8 shapes at random places, 6000 train",
        target_accuracy=0.85,
        learning_rate=0.2,
        batch_size=32,
        max_epochs=20,
    ),
    "rnn": Entry(
        make_dataset=_sequences,
        build=_build_rnn,
        data="toy translation: word t-3 through a 32-word dictionary, length 12",
        metric="per-token test accuracy",
        target_accuracy=0.88,
        learning_rate=1.0,
        batch_size=32,
        max_epochs=20,
    ),
    "sparse": Entry(
        make_dataset=_clicks,
        build=_build_sparse,
        data="click logs, 8 ids per example from 10000, Zipf(1.1) popularity",
        metric="click prediction test accuracy",
        target_accuracy=0.68,
        learning_rate=0.5,
        batch_size=32,
        max_epochs=20,
    ),
    "deep-mlp": Entry(
        make_dataset=lambda seed: data.make_text_dataset(seed),
        build=_build_deep_mlp,
        data="the mlp's documents; 1000-32-512-512-10, so layers differ in size (CadentFlow)",
        target_accuracy=0.9,
        learning_rate=0.1,
        batch_size=32,
        max_epochs=20,
    ),
    "even-mlp": Entry(
        make_dataset=lambda seed: data.make_text_dataset(seed),
        build=_build_even_mlp,
        data="the mlp's documents; 1000-256-1024-256-10: three dense layers of ~260k "
             "parameters each, so layers cost alike to send and compute (layer-wise)",
        target_accuracy=0.9,
        learning_rate=0.1,
        batch_size=128,
        max_epochs=20,
    ),
}
# The same two models in PyTorch, from the same initial parameters (torchzoo.py). Apart
# from _REGISTRY: names() (what sweeps and `tailcut models` iterate) stays the numpy
# models, which run wherever tailcut does; these need torch.
_TORCH_REGISTRY: dict[str, Entry] = {
    "torch-mlp": Entry(
        make_dataset=_torch_dataset("tailcut.ml.torchzoo:mlp"),
        build=_torch_build,
        data="the mlp's documents and initial parameters; a PyTorch nn.Module",
        target_accuracy=0.9,
        learning_rate=0.3,
        batch_size=32,
        max_epochs=20,
    ),
    "torch-cnn": Entry(
        make_dataset=_torch_dataset("tailcut.ml.torchzoo:cnn"),
        build=_torch_build,
        data="the cnn's images and initial parameters; a PyTorch nn.Module",
        target_accuracy=0.85,
        learning_rate=0.2,
        batch_size=32,
        max_epochs=20,
    ),
}
TORCH_MODELS = tuple(_TORCH_REGISTRY)


def names() -> list[str]:
    """Names of the registered numpy models, sorted (TORCH_MODELS: the PyTorch ones)."""
    return sorted(_REGISTRY)


def is_torch(name: str) -> bool:
    """Whether model ``name`` (a registry name or "torch:<module>") needs PyTorch."""
    return name in TORCH_MODELS or name.startswith(TORCH_PREFIX)


def _entry(name: str) -> Entry:
    if name.startswith(TORCH_PREFIX):   # a user's module: default settings
        return Entry(make_dataset=_torch_dataset(name[len(TORCH_PREFIX):]),
                     build=_torch_build, data=f"made by {name[len(TORCH_PREFIX):]}")
    try:
        return _REGISTRY[name] if name in _REGISTRY else _TORCH_REGISTRY[name]
    except KeyError:
        raise ValueError(f"model {name!r} is unknown; supported: {', '.join(names())}, "
                         f"{', '.join(TORCH_MODELS)}, {TORCH_PREFIX}<module>") from None


_loaded_ahead: dict[tuple[str, int], data.Dataset] = {}


def load_ahead(name: str, seed: int) -> None:
    """Load ``dataset(name, seed)`` now, for this process's next call of it to take,
    and import the model's modules (a model built and dropped): a role forked before
    its network was built does so meanwhile (tailcut.runtime.rolefork.ahead). Later
    calls load their own copy, as before."""
    if not is_torch(name):   # made with its model, by the role
        loaded = _loaded_ahead[(name, seed)] = dataset(name, seed)
        create(name, loaded)


def dataset(name: str, seed: int) -> data.Dataset:
    """The (generated, deterministic) dataset model ``name`` trains on; from the disk
    cache (tailcut.ml.cache) when an earlier role or run generated it already."""
    ahead = _loaded_ahead.pop((name, seed), None)
    if ahead is not None:
        return ahead
    from tailcut.ml import cache
    entry = _entry(name)
    if is_torch(name):   # built with its model, which it names (_torch_made): not cached
        return entry.make_dataset(seed)
    cached = cache.load(name, seed)
    if cached is not None:
        return cached
    made = entry.make_dataset(seed)
    cache.store(name, seed, made)
    return made


def create(name: str, dataset: data.Dataset) -> Model:
    """Build model ``name`` sized for ``dataset``."""
    return _entry(name).build(dataset)


def info(name: str) -> Entry:
    """The registry entry of model ``name``: data, metric, target and tuned settings."""
    return _entry(name)
