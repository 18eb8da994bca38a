"""A ToR kind from a package of its own, in one file (docs/in-network.md, "Adding a ToR
kind"): ``toy-count`` counts what passes. Its switch side loads no program: it reads
the rack ports' byte counters of the pods it serves, in each rack's namespace, for
network.json. Its roles' side changes nothing they send: each worker counts the
coordinates of every gradient it pushes (toy-count-worker-<i>.csv), the PS the pulls it
answers (toy-count-ps-0.json). A job asks for it with

    network: {inNetwork: {kinds: {toy-count: {label: <text>}}}}

and tailcut finds it by the entry point in toy_count-0.1.dist-info."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np

from tailcut import innetplan
from tailcut.innetwork.feature import Kind
from tailcut.net import naming
from tailcut.net.build import Network
from tailcut.net.topology import Pod, Topology
from tailcut.spec.model import TrainingJob
from tailcut.spec.tor_kinds import TorKind
from tailcut.training import records, torkinds

NAME = "toy-count"


# ---- the plan: its section of the role configurations -------------------------------

def section(job: TrainingJob, topo: Topology) -> Optional[dict[str, Any]]:
    """The job's options and each rack with workers (None: the job does not ask)."""
    options = innetplan.options(job, NAME)
    if options is None:
        return None
    return {"label": str(options.get("label", "")),
            **innetplan.worker_racks(topo, lambda rack: naming.rack_netns(job.name, rack))}


PLAN = innetplan.KindPlan(NAME, section)


# ---- the switch side: no program, the rack ports' counters ---------------------------

class PortCounters:
    """The rack ports of the pods served, read in the racks' namespaces."""

    name = NAME

    def __init__(self, label: str) -> None:
        self.label = label
        self.ports: dict[str, tuple[str, str]] = {}   # pod -> (rack netns, port)

    def serve_uplinks(self, network: Network) -> None:
        pass

    def serve_pods(self, network: Network, pods: Sequence[Pod]) -> None:
        for pod in pods:
            rack = network.topology.racks[pod.rack]
            self.ports[pod.name] = (rack.netns, naming.rack_port(pod.slot))

    def release_pod(self, network: Network, pod: Pod) -> None:
        self.ports.pop(pod.name, None)

    def links(self) -> dict[str, str]:
        return {f"{ns}/{port}": f"{NAME} (counted)" for ns, port in self.ports.values()}

    def describe(self) -> str:
        return f"ToR {NAME} ({self.label}): counting {len(self.ports)} ports"

    def summary(self) -> dict[str, Any]:
        """Bytes each pod's port received from it and sent to it."""
        out: dict[str, Any] = {}
        for pod, (ns, port) in sorted(self.ports.items()):
            shown = subprocess.run(["ip", "-n", ns, "-s", "-j", "link", "show", "dev", port],
                                   capture_output=True, text=True, check=True).stdout
            stats = json.loads(shown)[0]["stats64"]
            out[pod] = {"from_pod": stats["rx"]["bytes"], "to_pod": stats["tx"]["bytes"]}
        return {"label": self.label, "ports": out}

    def detach(self) -> list[str]:
        self.ports.clear()
        return []


def create(job: TrainingJob, section: dict[str, Any], network: Network,
           racks: Optional[Sequence[int]]) -> PortCounters:
    return PortCounters(section["label"])


PROGRAM = Kind(NAME, create)


# ---- the roles' side ----------------------------------------------------------------

class WorkerCount(torkinds.WorkerSide):
    """Per iteration: the non-zero coordinates of the gradient pushed, and its norm."""

    key = NAME

    def __init__(self, rack: int) -> None:
        self.rack = rack
        self.rows: list[dict[str, Any]] = []

    def push(self, grad: np.ndarray, step: int) -> bool:
        self.rows.append({"iteration": step, "rack": self.rack,
                          "nonzero": int(np.count_nonzero(grad)),
                          "norm": f"{float(np.linalg.norm(grad)):.6g}"})
        return False   # the worker pushes it to the PS as always

    def finish(self, results: Path, name: str) -> dict[str, Any]:
        with records.CsvLog(results / f"{NAME}-{name}.csv",
                            ("iteration", "rack", "nonzero", "norm")) as log:
            for row in self.rows:
                log.write(row)
        return {"pushes": len(self.rows)}


class PSCount(torkinds.PSSide):
    """The pulls the PS answered, per worker."""

    key = NAME

    def __init__(self, label: str) -> None:
        self.label = label
        self.pulls: dict[str, int] = {}

    def pulled(self, who: str, iteration: int, current: int) -> bool:
        self.pulls[who] = self.pulls.get(who, 0) + 1
        return False

    def finish(self, results: Path) -> dict[str, Any]:
        summary = {"label": self.label, "pulls": dict(sorted(self.pulls.items()))}
        (results / f"{NAME}-ps-0.json").write_text(json.dumps(summary) + "\n")
        return summary


def _worker(ctx: torkinds.WorkerContext) -> Optional[WorkerCount]:
    mine = torkinds.section(ctx.cfg, NAME)
    if mine is None:
        return None
    return WorkerCount(next(r["index"] for r in mine["racks"]
                            if ctx.cfg.index in r["workers"]))


def _ps(ctx: torkinds.PSContext) -> Optional[PSCount]:
    mine = torkinds.section(ctx.cfg, NAME)
    return PSCount(mine["label"]) if mine is not None and ctx.evaluates else None


ROLES = torkinds.RoleKind(NAME, ps=_ps, worker=_worker)


# ---- the declaration: what the entry point names ------------------------------------

KIND = TorKind(NAME, plan="toy_count:PLAN", program="toy_count:PROGRAM",
               roles="toy_count:ROLES")
