"""In-network aggregation for one job (spec.network.inNetwork.aggregate): one program
per rack with workers, loaded with the rack's group, made reachable (neighbour entries
for the rack's aggregation address) and attached to the rack's ports: each worker's
port for its ADDs, and the way to the PS (its port, or the rack's uplink) for the PS's
FLUSHes. A finished sum goes to the next hop toward the PS: the PS's MAC when it is in
the rack, else the spine's port's (the ToR is a bridge; the spine routes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from tailcut import innetplan
from tailcut.datapath import agg
from tailcut.innetplan import Section
from tailcut.innetwork.feature import Kind, detach_each
from tailcut.net import build, naming
from tailcut.net.build import Network
from tailcut.net.topology import Pod
from tailcut.spec.model import TrainingJob
from tailcut.transports import wire

NAME = innetplan.AGGREGATION.name


class Aggregation:
    """The programs of the racks an executor serves, by rack index."""

    name = NAME

    def __init__(self, job: TrainingJob, programs: dict[int, agg.Aggregator]) -> None:
        self.job, self.programs = job, programs
        self._links: dict[str, str] = {}

    def serve_uplinks(self, network: Network) -> None:
        """The PS's FLUSHes to the racks it is not in: the spine's neighbour entries and
        each such rack's `up`."""
        topo = network.topology
        ps_rack = topo.pod("ps-0").rack
        for index, program in self.programs.items():
            if index == ps_rack:
                continue
            build.point_at_tor(network, index, pods=(), spine=True, address=program.address,
                               mac=naming.AGGREGATION_MAC)
            program.attach(topo.racks[index].netns, naming.RACK_UPLINK_IF, "ps")
            program.set_next_hop(build.mac_of(topo.spine_netns, naming.spine_port(index)))
            self._links[f"{topo.racks[index].netns}/{naming.RACK_UPLINK_IF}"] = (
                f"aggregation (workers {program.members} at {program.address})")

    def serve_pods(self, network: Network, pods: Sequence[Pod]) -> None:
        """A worker's ADDs to its rack; ps-0's FLUSHes to its own rack."""
        topo = network.topology
        for index, program in self.programs.items():
            here = [p for p in pods
                    if p.rack == index and (p.role == "worker" or p.name == "ps-0")]
            if not here:
                continue
            build.point_at_tor(network, index, pods=here, spine=False,
                               address=program.address, mac=naming.AGGREGATION_MAC)
            for pod in here:
                port = naming.rack_port(pod.slot)
                if pod.role == "worker":
                    program.attach(topo.racks[index].netns, port, "worker", worker=pod.index)
                else:
                    program.attach(topo.racks[index].netns, port, "ps")
                    program.set_next_hop(build.mac_of(network.pods[pod.name],
                                                      network.wiring.ifname))

    def release_pod(self, network: Network, pod: Pod) -> None:
        program = self.programs.get(pod.rack)
        if program is not None:
            program.release(network.topology.racks[pod.rack].netns,
                            naming.rack_port(pod.slot))
            if pod.name == "ps-0":
                program.set_next_hop(None)   # until the PS is wired again

    def links(self) -> dict[str, str]:
        return dict(self._links)

    def describe(self) -> str:
        return (f"ToR aggregation: racks {sorted(self.programs)} sum their workers' "
                f"gradients for the PS")

    def summary(self) -> dict[str, Any]:
        """What each rack's ToR did: packets per reason."""
        return {f"rack-{index}": {"workers": p.members, "address": p.address,
                                  "packets": {k: v for k, v in p.stats().items() if v}}
                for index, p in sorted(self.programs.items())}

    def detach(self) -> list[str]:
        return detach_each("aggregation", dict(self.programs))


def create(job: TrainingJob, resolved: Section, network: Network,
           racks: Optional[Sequence[int]] = None) -> Optional[Aggregation]:
    """The programs of these racks (default all) that have workers, loaded, not yet
    serving; None when there are none."""
    ps = network.topology.pod("ps-0")
    ps_address = naming.pod_ip(ps.rack, ps.slot)
    programs: dict[int, agg.Aggregator] = {}
    try:
        for rack in resolved["racks"]:
            if racks is not None and rack["index"] not in racks:
                continue
            programs[rack["index"]] = agg.Aggregator(
                job=wire.job_id(job.name), rack=rack["index"], members=rack["workers"],
                elements=int(resolved["elements"]), address=rack["address"],
                ps_address=ps_address)
    except BaseException:
        Aggregation(job, programs).detach()
        raise
    return Aggregation(job, programs) if programs else None


KIND = Kind(name=NAME, create=create)
