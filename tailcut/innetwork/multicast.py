"""The ToR's multicast of the PS's parameters for one job (spec.network.inNetwork.
multicast): one program per rack with workers, loaded with the rack's multicast
address, attached to the way from the PS (ps-0's port when the PS is in the rack,
else the rack's uplink; the spine or ps-0 knows the address as a permanent neighbour)
and to each worker's port, whose entry says where that worker's copies go (its MAC
and address)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from tailcut import innetplan
from tailcut.datapath import mcast
from tailcut.innetplan import Section
from tailcut.innetwork.feature import Kind, detach_each
from tailcut.net import build, naming
from tailcut.net.build import Network
from tailcut.net.topology import Pod
from tailcut.spec.model import TrainingJob
from tailcut.transports import wire

NAME = innetplan.MULTICAST.name


class Multicast:
    """The programs of the racks an executor serves, by rack index."""

    name = NAME

    def __init__(self, programs: dict[int, mcast.Replicator]) -> None:
        self.programs = programs
        self._links: dict[str, str] = {}
        # copies sent out of ports since released (pod unwired), by rack and port
        self._released: dict[int, dict[str, int]] = {}

    def serve_uplinks(self, network: Network) -> None:
        """The PS's copies to the racks it is not in: the spine's neighbour entries and
        each such rack's `up`."""
        topo = network.topology
        ps_rack = topo.pod("ps-0").rack
        for index, program in self.programs.items():
            if index == ps_rack:
                continue
            build.point_at_tor(network, index, pods=(), spine=True, address=program.address,
                               mac=naming.MULTICAST_MAC)
            program.attach(topo.racks[index].netns, naming.RACK_UPLINK_IF, "ps")
            self._links[f"{topo.racks[index].netns}/{naming.RACK_UPLINK_IF}"] = (
                f"multicast (to workers of rack {index} at {program.address})")

    def serve_pods(self, network: Network, pods: Sequence[Pod]) -> None:
        """A worker's port: where its copies go. ps-0's port, in a rack with workers:
        the PS's copies, to the address ps-0 knows as a neighbour (the other racks'
        are reached through the spine)."""
        topo = network.topology
        for pod in pods:
            program = self.programs.get(pod.rack)
            if program is None:
                continue
            port = naming.rack_port(pod.slot)
            if pod.name == "ps-0":
                build.point_at_tor(network, pod.rack, pods=[pod], spine=False,
                                   address=program.address, mac=naming.MULTICAST_MAC)
                program.attach(topo.racks[pod.rack].netns, port, "ps")
            elif pod.role == "worker":
                program.attach(topo.racks[pod.rack].netns, port, "worker", worker=pod.index,
                               mac=build.mac_of(network.pods[pod.name],
                                                network.wiring.ifname),
                               ip=pod.ip)

    def release_pod(self, network: Network, pod: Pod) -> None:
        program = self.programs.get(pod.rack)
        if program is not None:
            ns, port = network.topology.racks[pod.rack].netns, naming.rack_port(pod.slot)
            sent = program.copies().get(f"{ns}/{port}", 0)
            done = self._released.setdefault(pod.rack, {})
            done[port] = done.get(port, 0) + sent   # the summary counts them still
            program.release(ns, port)

    def links(self) -> dict[str, str]:
        return dict(self._links)

    def describe(self) -> str:
        return (f"ToR multicast: racks {sorted(self.programs)} copy the PS's parameters "
                f"to their workers")

    def summary(self) -> dict[str, Any]:
        """What each rack's ToR did: packets per reason, copies per port."""
        out: dict[str, Any] = {}
        for index, p in sorted(self.programs.items()):
            copies = dict(self._released.get(index, {}))
            for key, sent in p.copies().items():
                port = key.rpartition("/")[2]
                copies[port] = copies.get(port, 0) + sent
            out[f"rack-{index}"] = {
                "address": p.address,
                "packets": {k: v for k, v in p.stats().items() if v},
                "copies": {k: v for k, v in sorted(copies.items()) if v}}
        return out

    def detach(self) -> list[str]:
        return detach_each("multicast", dict(self.programs))


def create(job: TrainingJob, resolved: Section, network: Network,
           racks: Optional[Sequence[int]] = None) -> Optional[Multicast]:
    """The programs of these racks (default all) that have workers, loaded, not yet
    serving; None when there are none."""
    programs: dict[int, mcast.Replicator] = {}
    try:
        for rack in resolved["racks"]:
            if racks is not None and rack["index"] not in racks:
                continue
            programs[rack["index"]] = mcast.Replicator(
                job=wire.job_id(job.name), rack=rack["index"],
                elements=int(resolved["elements"]), address=rack["address"])
    except BaseException:
        Multicast(programs).detach()
        raise
    return Multicast(programs) if programs else None


KIND = Kind(name=NAME, create=create)
