"""The parameters multicast at the ToR (spec.network.inNetwork.multicast) from the
roles' side: the PS sends each rack with workers one copy of an iteration's model
(ebpf/mcast.bpf.c copies it to the rack's workers) the first time it answers a pull of
that iteration, and answers every pull over TCP with an empty PARAMS saying so; a
worker then takes the copies from its socket and asks the PS again for the slots that
did not arrive (tailcut.transports.mcast)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from tailcut.training import records, torkinds
from tailcut.training.config import RoleConfig
from tailcut.transports import base, mcast, wire
from tailcut.transports.base import Message


class WorkerSide(torkinds.WorkerSide):
    """A worker's receiver of the copies, with what each iteration took. Its socket is
    open before the HELLO, which asks for the first."""

    key = "multicast"
    FIELDS = ("iteration", "seconds", "repaired_slots")

    def __init__(self, cfg: RoleConfig, elements: int) -> None:
        self.receiver = mcast.Receiver(wire.job_id(cfg.job), cfg.index, elements,
                                       cfg.ps_host)
        self.rows: list[tuple[int, float, int]] = []

    def take_params(self, step: int, params: np.ndarray, msg: Message,
                    timeout_s: float) -> bool:
        """An empty PARAMS says the copies are in the socket, or lost: take them,
        repair the rest."""
        if msg.values.size != 0:
            return False
        started = time.perf_counter()
        try:
            repaired = self.receiver.receive(step, params, timeout_s)
        except base.TransportTimeout as err:
            raise base.TransportTimeout(f"PARAMS({step}): {err}") from None
        self.rows.append((step, time.perf_counter() - started, repaired))
        return True

    def finish(self, results: Path, name: str) -> dict[str, Any]:
        with records.CsvLog(results / f"mcast-{name}.csv", self.FIELDS) as log:
            for it, seconds, repaired in self.rows:
                log.write({"iteration": it, "seconds": f"{seconds:.6f}",
                           "repaired_slots": repaired})
        s = self.receiver.stats
        self.receiver.close()
        return {"copies": s.copies, "repaired_slots": s.repaired, "requests": s.requests,
                "lossy_iterations": s.lossy_iterations, "stale": s.stale,
                "malformed": s.malformed}


class PSSide(torkinds.PSSide):
    """The PS's publisher: each iteration's model once per rack, and the repairs; each
    pull is answered with an empty PARAMS, word of the copies."""

    key = "multicast"

    def __init__(self, cfg: RoleConfig, elements: int) -> None:
        assert cfg.multicast is not None
        self.publisher = mcast.Publisher(
            wire.job_id(cfg.job), elements, [r["address"] for r in cfg.multicast["racks"]],
            bind=cfg.ps_host)
        self.finished = False

    def reply(self, iteration: int, params: np.ndarray) -> np.ndarray:
        """Send the racks the model of ``iteration`` unless they have it already (under
        BSP every pull of an iteration gets the same model); the pull gets none."""
        if self.publisher.iteration != iteration:
            self.publisher.publish(iteration, params)
        return np.zeros(0, dtype=np.float32)

    def close(self) -> None:
        if not self.finished:
            self.finish(None)

    def finish(self, results: Path | None) -> dict[str, Any]:
        self.finished = True
        s = self.publisher.stats
        self.publisher.close()
        return {"published": s.published, "datagrams": s.datagrams,
                "repair_requests": s.repair_requests, "repaired_slots": s.repaired_slots,
                "stale_requests": s.stale_requests, "malformed": s.malformed}


ROLES = torkinds.RoleKind(
    "multicast",
    ps=lambda ctx: (PSSide(ctx.cfg, ctx.size)
                    if ctx.cfg.multicast is not None and ctx.active else None),
    worker=lambda ctx: (WorkerSide(ctx.cfg, ctx.model.num_params)
                        if ctx.cfg.multicast is not None else None))
