"""Which parameters the ToR holds (spec.network.inNetwork.hotParameters): the given
indices, or the top k by how often a gradient changes them, measured on the job's own
training data before training starts. Chosen once (tailcut.innetplan, for
tailcut.plan.in_network) and handed to every role as indices; pure, so the operator
chooses them without loading the transports (the roles' side is tailcut.training.hotset)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tailcut.ml import data, models

PROFILE_BATCHES = 256   # minibatches measured: enough to rank a Zipf tail, a second or so


def update_frequency(model: models.Model, dataset: data.Dataset, batch_size: int,
                     seed: int) -> np.ndarray:
    """How many of the first PROFILE_BATCHES minibatches give each parameter a non-zero
    gradient, at the initial parameters."""
    params = model.init_params(np.random.default_rng(seed))
    counts = np.zeros(model.num_params, dtype=np.int64)
    rows = len(dataset.x_train)
    for b in range(PROFILE_BATCHES):
        lo = (b * batch_size) % max(1, rows - batch_size)
        _, grad = model.loss_and_grad(params, dataset.x_train[lo:lo + batch_size],
                                      dataset.y_train[lo:lo + batch_size])
        counts += grad != 0
    return counts


def select(hot: dict[str, Any], model: models.Model, dataset: data.Dataset,
           batch_size: int, seed: int) -> np.ndarray:
    """The hot parameters' flat indices, ascending. ``hot`` is the spec's
    hotParameters as a RoleConfig carries it: {"top_k": k} or {"indices": [...]}."""
    if hot.get("indices") is not None:
        indices = np.asarray(sorted(hot["indices"]), dtype=np.int64)
        if indices[-1] >= model.num_params:
            raise ValueError(f"hotParameters.indices: {int(indices[-1])} is past the "
                             f"model's {model.num_params} parameters")
        return indices
    k = int(hot["top_k"])
    if k > model.num_params:
        raise ValueError(f"hotParameters.topK: {k} is more than the model's "
                         f"{model.num_params} parameters")
    counts = update_frequency(model, dataset, batch_size, seed)
    order = np.lexsort((np.arange(counts.size), -counts))   # most updated, then lowest index
    return np.sort(order[:k])
