"""A role's side of the ToR's hot parameters (spec.network.inNetwork.hotParameters),
which tailcut.training.hotchoice chose before the job started."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from tailcut.ml import data, models
from tailcut.training import hotchoice, records
from tailcut.training.config import RoleConfig
from tailcut.transports import hot, wire


class HotShare:
    """A role's side of the ToR's hot parameters: a worker pulls them into its copy of
    the model and pushes its update of them (-lr / workers x gradient, as the PS's BSP
    step would apply it); the PS reads them to evaluate the whole model."""

    def __init__(self, cfg: RoleConfig, model: models.Model, dataset: data.Dataset,
                 worker: int) -> None:
        assert cfg.hot is not None
        self.index = hotchoice.select(cfg.hot, model, dataset, cfg.batch_size, cfg.seed)
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
