"""The ToR's hot-parameter store for one job: loaded with the hot parameters' initial
values, made reachable (neighbour entries for its address), attached to the ports of
ps-0's rack."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import numpy as np

from tailcut.datapath import tor
from tailcut.net import build, naming
from tailcut.net.build import Network
from tailcut.net.topology import Pod
from tailcut.spec.model import TrainingJob
from tailcut.ml import models
from tailcut.training import hotset
from tailcut.transports import wire


def home_rack(job: TrainingJob, network: Network) -> int:
    """The rack whose ToR holds the store: ps-0's."""
    return network.topology.pod("ps-0").rack


def create(job: TrainingJob, network: Network) -> Optional[tor.Store]:
    """The job's store, loaded and not yet attached; None when the job asks for none."""
    config = hotset.config(job)
    if config is None:
        return None
    t = job.spec.training
    dataset = models.dataset(t.model, t.seed)
    model = models.create(t.model, dataset)
    index = hotset.select(config, model, dataset, t.batch_size, t.seed)
    initial = model.init_params(np.random.default_rng(t.seed))[index]
    return tor.Store(job=wire.job_id(job.name), workers=job.spec.replicas.workers,
                     address=config["address"], initial=initial)


def serve_uplink(store: tor.Store, job: TrainingJob, network: Network) -> None:
    """Requests from the other racks: the spine's neighbour entry and the rack's `up`,
    which carries only the workers of the other racks."""
    topo = network.topology
    rack = topo.racks[home_rack(job, network)]
    build.point_at_tor(network, rack.index, pods=(), spine=True,
                       address=store.address, mac=naming.HOT_STORE_MAC)
    remote = [p.index for p in topo.pods if p.role == "worker" and p.rack != rack.index]
    store.attach(rack.netns, naming.RACK_UPLINK_IF, "uplink", workers=remote)


def serve_pods(store: tor.Store, job: TrainingJob, network: Network,
               pods: Sequence[Pod]) -> None:
    """Requests from these pods of the home rack: their neighbour entries and ports.
    A worker's port carries only that worker; ps-0's may read the counts."""
    rack = network.topology.racks[home_rack(job, network)]
    here = [p for p in pods if p.rack == rack.index]
    build.point_at_tor(network, rack.index, pods=here, spine=False,
                       address=store.address, mac=naming.HOT_STORE_MAC)
    for pod in here:
        port = naming.rack_port(pod.slot)
        if pod.role == "worker":
            store.attach(rack.netns, port, "worker", workers=[pod.index])
        elif pod.name == "ps-0":
            store.attach(rack.netns, port, "ps")


def release_pod(store: tor.Store, job: TrainingJob, network: Network, pod: Pod) -> None:
    """The pod was unwired: free its port's entry (the agent wires pods again and again
    over a fabric's life)."""
    rack = network.topology.racks[home_rack(job, network)]
    if pod.rack == rack.index:
        store.release(rack.netns, naming.rack_port(pod.slot))


def start(job: TrainingJob, network: Network) -> Optional[tor.Store]:
    """`tailcut run`: the store serving every port of the home rack, or None."""
    store = create(job, network)
    if store is None:
        return None
    try:
        serve_uplink(store, job, network)
        serve_pods(store, job, network, network.topology.racks[home_rack(job, network)].pods)
    except BaseException:
        store.detach()
        raise
    return store


def summary(store: tor.Store) -> dict[str, object]:
    """What the store did, for network.json: packets per reason, slots' iterations
    (call before detach)."""
    return {"elements": store.elements, "address": store.address,
            "packets": {k: v for k, v in store.stats().items() if v},
            "iterations": sorted(set(store.iterations()))}
