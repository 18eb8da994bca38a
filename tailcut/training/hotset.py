"""A role's side of the ToR's hot parameters (spec.network.inNetwork.hotParameters),
which tailcut.training.hotchoice chose before the job started."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from tailcut.ml import data, models
from tailcut.training import hotchoice, records, torkinds
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


class PSSide(torkinds.PSSide):
    """The evaluating PS reads the hot values into its whole model; at the end it asks
    the ToR for their update counts (updates-tor.npz). Its own copies never move:
    workers push zeros there."""

    key = "hot"
    holds_parameters = True

    def __init__(self, share: HotShare) -> None:
        self.share = share

    def fill_model(self, full: np.ndarray, iteration: int) -> None:
        self.share.pull_into(full, iteration)

    def finish(self, results: Path) -> dict[str, Any]:
        np.savez(results / "updates-tor.npz", counts=self.share.client.counts(),
                 index=self.share.index)
        return self.share.finish(results / "hot-ps-0.csv")


class WorkerSide(torkinds.WorkerSide):
    """A worker pulls the hot values after the PS's share and pushes its update of
    them first (the PS's barrier then implies the ToR's), zeroed in what the PS gets."""

    key = "hot"

    def __init__(self, share: HotShare) -> None:
        self.share = share

    def pulled(self, params: np.ndarray, step: int) -> None:
        self.share.pull_into(params, step)

    def push(self, grad: np.ndarray, step: int) -> bool:
        self.share.push_from(grad, step)
        return False

    def finish(self, results: Path, name: str) -> dict[str, Any]:
        return self.share.finish(results / f"hot-{name}.csv")


def _ps(ctx: torkinds.PSContext) -> PSSide | None:
    if ctx.cfg.hot is None or not ctx.evaluates:
        return None
    return PSSide(HotShare(ctx.cfg, ctx.model, ctx.dataset, worker=hot.PS_WORKER))


def _worker(ctx: torkinds.WorkerContext) -> WorkerSide | None:
    if ctx.cfg.hot is None:
        return None
    return WorkerSide(HotShare(ctx.cfg, ctx.model, ctx.dataset, worker=ctx.cfg.index))


ROLES = torkinds.RoleKind("hot_store", ps=_ps, worker=_worker)
