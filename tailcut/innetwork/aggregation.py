"""In-network aggregation for one job: one program per rack with workers, loaded with
the rack's group, made reachable (neighbour entries for the rack's aggregation
address) and attached to the rack's ports: each worker's port for its ADDs, and the
way to the PS (its port, or the rack's uplink) for the PS's FLUSHes. A finished sum
goes to the next hop toward the PS: the PS's MAC when it is in the rack, else the
spine's port's (the ToR is a bridge; the spine routes)."""

from __future__ import annotations

from collections.abc import Sequence

from tailcut.datapath import agg
from tailcut.net import build, naming
from tailcut.net.build import Network
from tailcut.net.topology import Pod
from tailcut.spec.model import TrainingJob
from tailcut.ml import models
from tailcut.training import innetagg
from tailcut.transports import wire

Aggregators = dict[int, agg.Aggregator]   # rack index -> its rack's program


def create(job: TrainingJob, network: Network, racks: Sequence[int] | None = None
           ) -> Aggregators:
    """The job's programs (of these racks; default all), loaded, not attached; empty
    when the job does not aggregate."""
    config = innetagg.config(job)
    if config is None:
        return {}
    t = job.spec.training
    elements = models.create(t.model, models.dataset(t.model, t.seed)).num_params
    ps = network.topology.pod("ps-0")
    ps_address = naming.pod_ip(ps.rack, ps.slot)
    out: Aggregators = {}
    try:
        for rack in config["racks"]:
            if racks is not None and rack["index"] not in racks:
                continue
            out[rack["index"]] = agg.Aggregator(
                job=wire.job_id(job.name), rack=rack["index"], members=rack["workers"],
                elements=elements, address=rack["address"], ps_address=ps_address)
    except BaseException:
        detach(out)
        raise
    return out


def serve_uplink(aggregators: Aggregators, network: Network) -> None:
    """The PS's FLUSHes to the racks it is not in: the spine's neighbour entries and
    each such rack's `up`."""
    if not aggregators:
        return   # (and a job without a PS, syncMode allreduce, has none)
    topo = network.topology
    ps_rack = topo.pod("ps-0").rack
    for index, program in aggregators.items():
        if index == ps_rack:
            continue
        build.point_at_tor(network, index, pods=(), spine=True, address=program.address,
                           mac=naming.AGGREGATION_MAC)
        program.attach(topo.racks[index].netns, naming.RACK_UPLINK_IF, "ps")
        program.set_next_hop(build.mac_of(topo.spine_netns, naming.spine_port(index)))


def serve_pods(aggregators: Aggregators, network: Network, pods: Sequence[Pod]) -> None:
    """These pods' ports: a worker's ADDs to its rack; ps-0's FLUSHes to its own rack."""
    topo = network.topology
    for index, program in aggregators.items():
        here = [p for p in pods if p.rack == index and (p.role == "worker" or p.name == "ps-0")]
        if not here:
            continue
        build.point_at_tor(network, index, pods=here, spine=False, address=program.address,
                           mac=naming.AGGREGATION_MAC)
        for pod in here:
            port = naming.rack_port(pod.slot)
            if pod.role == "worker":
                program.attach(topo.racks[index].netns, port, "worker", worker=pod.index)
            else:
                program.attach(topo.racks[index].netns, port, "ps")
                program.set_next_hop(build.mac_of(network.pods[pod.name],
                                                  network.wiring.ifname))


def release_pod(aggregators: Aggregators, network: Network, pod: Pod) -> None:
    """The pod was unwired: free its port's entry."""
    program = aggregators.get(pod.rack)
    if program is not None:
        program.release(network.topology.racks[pod.rack].netns, naming.rack_port(pod.slot))
        if pod.name == "ps-0":
            program.set_next_hop(None)   # until the PS is wired again


def start(job: TrainingJob, network: Network) -> Aggregators:
    """`tailcut run`: every rack's program serving its ports; empty without aggregate."""
    aggregators = create(job, network)
    try:
        serve_uplink(aggregators, network)
        serve_pods(aggregators, network, network.topology.pods)
    except BaseException:
        detach(aggregators)
        raise
    return aggregators


def detach(aggregators: Aggregators) -> list[str]:
    """Detach every rack's program; the errors (each one is tried)."""
    errors = []
    for program in aggregators.values():
        try:
            program.detach()
        except Exception as err:   # noqa: BLE001 -- the others must go regardless
            errors.append(f"rack {program.rack}: {err}")
    return errors


def summary(aggregators: Aggregators) -> dict[str, object]:
    """What each rack's ToR did, for network.json: packets per reason."""
    return {f"rack-{index}": {"workers": program.members, "address": program.address,
                              "packets": {k: v for k, v in program.stats().items() if v}}
            for index, program in sorted(aggregators.items())}
