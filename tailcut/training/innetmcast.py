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

from tailcut.training import records
from tailcut.training.config import RoleConfig
from tailcut.transports import mcast, wire


class WorkerSide:
    """A worker's receiver of the copies, with what each iteration took."""

    FIELDS = ("iteration", "seconds", "repaired_slots")

    def __init__(self, cfg: RoleConfig, elements: int) -> None:
        self.receiver = mcast.Receiver(wire.job_id(cfg.job), cfg.index, elements,
                                       cfg.ps_host)
        self.rows: list[tuple[int, float, int]] = []

    def receive(self, iteration: int, params: np.ndarray, timeout_s: float) -> None:
        started = time.perf_counter()
        repaired = self.receiver.receive(iteration, params, timeout_s)
        self.rows.append((iteration, time.perf_counter() - started, repaired))

    def finish(self, path: Path) -> dict[str, Any]:
        with records.CsvLog(path, self.FIELDS) as log:
            for it, seconds, repaired in self.rows:
                log.write({"iteration": it, "seconds": f"{seconds:.6f}",
                           "repaired_slots": repaired})
        s = self.receiver.stats
        self.receiver.close()
        return {"copies": s.copies, "repaired_slots": s.repaired, "requests": s.requests,
                "lossy_iterations": s.lossy_iterations, "stale": s.stale,
                "malformed": s.malformed}


class PSSide:
    """The PS's publisher: each iteration's model once per rack, and the repairs."""

    def __init__(self, cfg: RoleConfig, elements: int) -> None:
        assert cfg.multicast is not None
        self.publisher = mcast.Publisher(
            wire.job_id(cfg.job), elements, [r["address"] for r in cfg.multicast["racks"]],
            bind=cfg.ps_host)

    def publish_once(self, iteration: int, params: np.ndarray) -> None:
        """Send the racks the model of ``iteration`` unless they have it already (under
        BSP every pull of an iteration gets the same model)."""
        if self.publisher.iteration != iteration:
            self.publisher.publish(iteration, params)

    def finish(self) -> dict[str, Any]:
        s = self.publisher.stats
        self.publisher.close()
        return {"published": s.published, "datagrams": s.datagrams,
                "repair_requests": s.repair_requests, "repaired_slots": s.repaired_slots,
                "stale_requests": s.stale_requests, "malformed": s.malformed}
