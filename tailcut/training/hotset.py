"""Which parameters the ToR holds (spec.network.inNetwork.hotParameters): the given
indices, or the top k by how often a gradient changes them, measured on the job's own
training data before training starts. Chosen once (tailcut.plan.in_network, through
tailcut.innetwork.hotstore) and handed to every role as indices."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from tailcut.ml import data, models
from tailcut.training import records
from tailcut.training.config import RoleConfig
from tailcut.transports import hot, wire

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


class HotShare:
    """A role's side of the ToR's hot parameters: a worker pulls them into its copy of
    the model and pushes its update of them (-lr / workers x gradient, as the PS's BSP
    step would apply it); the PS reads them to evaluate the whole model."""

    def __init__(self, cfg: RoleConfig, model: models.Model, dataset: data.Dataset,
                 worker: int) -> None:
        assert cfg.hot is not None
        self.index = select(cfg.hot, model, dataset, cfg.batch_size, cfg.seed)
        self.client = hot.Client(cfg.hot["address"], wire.job_id(cfg.job), worker,
                                 len(self.index), timeout_s=cfg.timeout_s)
        self.step_scale = cfg.learning_rate / cfg.num_workers
        self.times: list[tuple[str, int, float]] = []   # (op, iteration, seconds)

    def pull_into(self, params: np.ndarray, iteration: int) -> None:
        started = time.perf_counter()
        params[self.index] = self.client.pull(iteration)
        self.times.append(("pull", iteration, time.perf_counter() - started))

    def push_from(self, grad: np.ndarray, iteration: int) -> None:
        """Send the hot part of ``grad`` to the ToR and zero it: the PS gets the rest."""
        started = time.perf_counter()
        self.client.push(iteration, -self.step_scale * grad[self.index])
        grad[self.index] = 0.0
        self.times.append(("push", iteration, time.perf_counter() - started))

    def finish(self, path: Path) -> dict[str, Any]:
        """Write every pull's and push's time to ``path``; return a summary."""
        with records.CsvLog(path, ("op", "iteration", "seconds")) as log:
            for op, it, seconds in self.times:
                log.write({"op": op, "iteration": it, "seconds": f"{seconds:.6f}"})
        s = self.client.stats
        self.client.close()
        return {"elements": len(self.index), "requests": s.requests, "resends": s.resends,
                "not_ready": s.not_ready, "saturated": s.saturated}
