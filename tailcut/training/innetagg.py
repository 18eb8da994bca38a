"""In-network aggregation (spec.network.inNetwork.aggregate) from the roles' side: every
rack's ToR sums the gradients of the rack's workers and sends the PS one sum per slot
(ebpf/agg.bpf.c). A worker sends its whole gradient to its rack's aggregation address
instead of pushing it to the PS, then asks the PS for the next iteration as always;
once every worker has asked, the PS takes the racks' sums (flushing what is missing)
and steps on them as its aggregation rule combines them (tailcut.training.aggregation:
by default their mean over the workers whose values arrived)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from tailcut import errors
from tailcut.training import records, torkinds
from tailcut.training.config import RoleConfig
from tailcut.transports import agg, base, wire


def _racks(cfg: RoleConfig) -> list[agg.Rack]:
    assert cfg.aggregate is not None
    return [agg.Rack(r["index"], r["address"], tuple(r["workers"]))
            for r in cfg.aggregate["racks"]]


class WorkerSide(torkinds.WorkerSide):
    """A worker's gradient to its rack's ToR, with the time each send took."""

    key = "aggregate"

    def __init__(self, cfg: RoleConfig, elements: int) -> None:
        rack = next(r for r in _racks(cfg) if cfg.index in r.workers)
        self.sender = agg.Sender(rack.address, wire.job_id(cfg.job), cfg.index, elements,
                                 rack_size=len(rack.workers))
        self.times: list[tuple[int, float]] = []

    def push(self, grad: np.ndarray, step: int) -> bool:
        """Send the gradient to the ToR: the PULL that follows tells the PS it was sent."""
        started = time.perf_counter()
        self.sender.send(step, grad)
        self.times.append((step, time.perf_counter() - started))
        return True

    def finish(self, results: Path, name: str) -> dict[str, Any]:
        with records.CsvLog(results / f"agg-{name}.csv", ("iteration", "seconds")) as log:
            for it, seconds in self.times:
                log.write({"iteration": it, "seconds": f"{seconds:.6f}"})
        self.sender.close()
        return {"packets": self.sender.packets, "saturated": self.sender.saturated}


class PSSide(torkinds.PSSide):
    """The PS's collector of the racks' sums, with what each iteration took. No worker
    pushes to the PS: once all have asked for the next iteration, the sums are taken."""

    key = "aggregate"
    FIELDS = ("iteration", "wait_s", "flushed_slots", "missing_contributions")

    def __init__(self, cfg: RoleConfig, elements: int) -> None:
        self.collector = agg.Collector(wire.job_id(cfg.job), elements, _racks(cfg))
        self.rows: list[dict[str, Any]] = []
        self.workers = cfg.num_workers
        self.asked_next: set[str] = set()

    def pulled(self, who: str, iteration: int, current: int) -> bool:
        if iteration != current + 1:
            return False
        self.asked_next.add(who)
        if len(self.asked_next) < self.workers:
            return False
        self.asked_next.clear()
        return True

    def sums(self, iteration: int, timeout_s: float) -> tuple[np.ndarray, np.ndarray]:
        """The iteration's summed gradient over the contributions that arrived and how
        many contributed to each element (both float64). RunError if a ToR does not
        answer in time."""
        started = time.perf_counter()
        try:
            total, counts, got = self.collector.collect(iteration, timeout_s)
        except base.ProtocolError as err:
            raise errors.RunError(f"iteration {iteration}: {err}") from err
        self.rows.append({"iteration": iteration,
                          "wait_s": f"{time.perf_counter() - started:.6f}",
                          "flushed_slots": got.flushed,
                          "missing_contributions": got.missing})
        return total, counts

    def finish(self, results: Path) -> dict[str, Any]:
        with records.CsvLog(results / "agg-ps-0.csv", self.FIELDS) as log:
            for row in self.rows:
                log.write(row)
        s = self.collector.stats
        self.collector.close()
        return {"iterations": len(self.rows), "sums": s.forwarded, "flushes": s.flushes,
                "flushed_slots": sum(r["flushed_slots"] for r in self.rows),
                "missing_contributions": sum(r["missing_contributions"] for r in self.rows),
                "not_ready": s.not_ready, "late": s.late, "malformed": s.malformed}

    def close(self) -> None:
        self.collector.close()


ROLES = torkinds.RoleKind(
    "aggregation",
    ps=lambda ctx: PSSide(ctx.cfg, ctx.size) if ctx.cfg.aggregate is not None else None,
    worker=lambda ctx: (WorkerSide(ctx.cfg, ctx.model.num_params)
                        if ctx.cfg.aggregate is not None else None))
