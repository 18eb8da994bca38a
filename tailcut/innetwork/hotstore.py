"""The ToR's hot-parameter store for one job (spec.network.inNetwork.hotParameters):
loaded with the hot parameters' initial values, made reachable (neighbour entries for
its address), attached to the ports of ps-0's rack and its uplink."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from tailcut import innetplan
from tailcut.datapath import tor
from tailcut.innetplan import Section
from tailcut.innetwork.feature import Kind
from tailcut.net import build, naming
from tailcut.net.build import Network
from tailcut.net.topology import Pod
from tailcut.spec.model import TrainingJob
from tailcut.transports import wire

NAME = innetplan.HOT_STORE.name


class HotStore:
    """The store (one program, in ps-0's rack) as a ToR feature."""

    name = NAME

    def __init__(self, job: TrainingJob, resolved: Section) -> None:
        self.job, self.rack = job, int(resolved["rack"])
        initial = np.frombuffer(base64.b64decode(resolved["initial"]), dtype="<f4")
        self.store = tor.Store(job=wire.job_id(job.name), workers=job.spec.replicas.workers,
                               address=resolved["address"], initial=initial)
        self._links: dict[str, str] = {}

    def serve_uplinks(self, network: Network) -> None:
        """Requests from the other racks: the spine's neighbour entry and the rack's
        `up`, which carries only the workers of the other racks."""
        topo = network.topology
        rack = topo.racks[self.rack]
        build.point_at_tor(network, rack.index, pods=(), spine=True,
                           address=self.store.address, mac=naming.HOT_STORE_MAC)
        remote = [p.index for p in topo.pods if p.role == "worker" and p.rack != rack.index]
        self.store.attach(rack.netns, naming.RACK_UPLINK_IF, "uplink", workers=remote)
        self._links[f"{rack.netns}/{naming.RACK_UPLINK_IF}"] = (
            f"hot-parameter store ({self.store.elements} parameters at "
            f"{self.store.address})")

    def serve_pods(self, network: Network, pods: Sequence[Pod]) -> None:
        """A worker's port carries only that worker; ps-0's may read the counts."""
        rack = network.topology.racks[self.rack]
        here = [p for p in pods if p.rack == rack.index]
        if not here:
            return
        build.point_at_tor(network, rack.index, pods=here, spine=False,
                           address=self.store.address, mac=naming.HOT_STORE_MAC)
        for pod in here:
            port = naming.rack_port(pod.slot)
            if pod.role == "worker":
                self.store.attach(rack.netns, port, "worker", workers=[pod.index])
            elif pod.name == "ps-0":
                self.store.attach(rack.netns, port, "ps")

    def release_pod(self, network: Network, pod: Pod) -> None:
        if pod.rack == self.rack:
            self.store.release(network.topology.racks[self.rack].netns,
                               naming.rack_port(pod.slot))

    def links(self) -> dict[str, str]:
        return dict(self._links)

    def describe(self) -> str:
        return (f"ToR hot-parameter store: {self.store.elements} parameters at "
                f"{self.store.address}")

    def summary(self) -> dict[str, Any]:
        """Packets per reason, slots' iterations."""
        return {"elements": self.store.elements, "address": self.store.address,
                "packets": {k: v for k, v in self.store.stats().items() if v},
                "iterations": sorted(set(self.store.iterations()))}

    def detach(self) -> list[str]:
        try:
            self.store.detach()
        except Exception as err:   # noqa: BLE001 -- reported with the others'
            return [f"hot-parameter store: {err}"]
        return []


def create(job: TrainingJob, resolved: Section, network: Network,
           racks: Optional[Sequence[int]] = None) -> Optional[HotStore]:
    """The store, loaded, not yet serving; None if ps-0's rack is not among ``racks``."""
    if racks is not None and int(resolved["rack"]) not in racks:
        return None
    return HotStore(job, resolved)


KIND = Kind(name=NAME, create=create)
