"""A job's fabric on this node (its spine and the racks placed here) and its pods
wired into it: built, wired and undone with the same code as `tailcut run`
(tailcut.net.build), with cadentflow's classes and the ToR programs on top.

Names: tck8s-<namespace>.<job>@<node>.rack-<r> and .spine for a job's fabric.
"""

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Optional

from tailcut import innetwork
from tailcut.datapath import dropper
from tailcut.k8s import metrics
from tailcut.k8s.agent import podns
from tailcut.k8s.agent.errors import AgentError, NodeUnfit
from tailcut.k8s.manifests import placement
from tailcut.net import build, clean, naming, netns, overlay, topology
from tailcut.scheduling import enforce
from tailcut.spec.model import TrainingJob

DATA_IF = naming.DATA_IF
log = logging.getLogger("tailcut.agent")


def fabric_name(namespace: str, job: str, node: str) -> str:
    """The prefix of a job's spine and rack namespaces on a node. The node's name is
    in it because agents of several nodes may share a mount namespace (nodes that are
    network namespaces of one host, as in the tests)."""
    return f"{podns.PREFIX}{namespace}.{job}@{node}"


def node_topology(job: TrainingJob, namespace: str, node: str) -> topology.Topology:
    """The job's topology plan with its spine and racks named for the node agent."""
    topo = topology.plan(job)
    base = fabric_name(namespace, job.name, node)
    racks = tuple(dataclasses.replace(r, netns=f"{base}.rack-{r.index}") for r in topo.racks)
    return dataclasses.replace(topo, racks=racks, spine_netns=f"{base}.spine")


@dataclass
class Fabric:
    """One job's spine and racks on this node, and its pods wired into them."""

    namespace: str
    job: TrainingJob
    node: str
    network: build.Network
    enforcement: Optional[enforce.Enforcement] = None   # cadentflow on the uplinks
    # the ToR programs (spec.network.inNetwork) of the racks on this node
    tor: list[innetwork.TorFeature] = field(default_factory=list)
    job_uid: str = ""   # the TrainingJob's: which incarnation of the job
    adopted: bool = False   # built by an earlier agent (holder.py), taken over
    held_as: str = ""       # what it was built for, as the holder keeps it (daemon._tag)
    overlay_vni: Optional[int] = None   # its VXLAN, guarded in the node's namespace
    pods: dict[str, "Wired"] = field(default_factory=dict)   # by pod UID


@dataclass
class Wired:
    """A pod wired into its rack."""

    uid: str
    name: str            # the agent's name for the pod's network namespace
    replica: str         # ps-0, worker-3, bg-server-0: the pod's name in the plan
    fabric: Fabric
    where: str = ""      # <namespace>/<pod>, for the log
    pod_name: str = ""   # the Kubernetes pod's name (in fabric.namespace)
    applied: dict[str, str] = field(default_factory=dict)
    enforcement: Optional[enforce.Enforcement] = None
    adopted: bool = False   # wired by an earlier agent, taken over as it is

    @property
    def description(self) -> str:
        """'worker-0/tc0: htb 1 Gbit/s, ...; rack-0/p1: ...': what its links got."""
        return "; ".join(f"{readable(self.fabric, {self.name: self.replica}, k)}: {v}"
                         for k, v in self.applied.items())


def readable(fabric: Fabric, wired_ns: dict[str, str], key: str) -> str:
    """'tck8s-lab.demo.rack-0/up' -> 'rack-0/up'; a pod's namespace -> its replica."""
    ns, _, ifname = key.rpartition("/")
    base = fabric_name(fabric.namespace, fabric.job.name, fabric.node) + "."
    return f"{wired_ns.get(ns) or ns.removeprefix(base)}/{ifname}"


def build_fabric(namespace: str, job: TrainingJob, has_netem: bool, node: str,
                 where: placement.Placement, overlay_id: Optional[int] = None,
                 vnis_taken: Optional[dict[int, str]] = None,
                 tor: Optional[innetwork.Sections] = None) -> Fabric:
    """The job's spine and the racks placed on `node` (every rack that holds a pod,
    without a placement; a rack with no pod is built nowhere), with cadentflow's classes on both ends of every uplink, the VXLAN of
    `overlay_id` (the job's status.overlayId) to the job's spines on other nodes
    (refused if that VNI is one of `vnis_taken`, another job's on this node), and the
    ToR programs of `tor` (the sections the operator resolved, tailcut.plan.in_network)
    serving the racks' uplinks. Call it from the node's network namespace. All or
    nothing."""
    topo = node_topology(job, namespace, node)
    here = _racks_here(job, topo, node, where)
    if not here:
        raise AgentError(f"{namespace}/{job.name}: no rack of the job is placed on node "
                         f"{node} ({', '.join(f'{r}: {n.name}' for r, n in where.items())})")
    spines = _spines(topo, where)
    if len(spines) > 1 and overlay_id is None:
        raise AgentError(f"{namespace}/{job.name}: its racks are on several nodes and the "
                         "operator recorded no VXLAN id for it (status.overlayId)")
    if len(spines) > 1 and overlay_id in (vnis_taken or {}):
        raise AgentError(f"{namespace}/{job.name}: its VXLAN id {overlay_id} "
                         f"(status.overlayId) is also {(vnis_taken or {})[overlay_id]}'s on "
                         "this node: the operator gives each job its own, so one of them "
                         "was recorded by hand or by another operator; delete one of the jobs")
    if len(spines) > 1:   # checked before anything is built
        short = overlay.too_small([s for n, s in spines.items() if n != node], topo.mtu)
        if short is not None:
            raise NodeUnfit(
                f"{namespace}/{job.name}: spec.network.mtu is {topo.mtu} and its racks on "
                f"other nodes are joined by VXLAN, {overlay.VXLAN_OVERHEAD_BYTES} bytes more "
                f"per packet, but node {node} reaches {short.peer_ip} through "
                f"{short.ifname} of MTU {short.link_mtu}, short of the "
                f"{topo.mtu + overlay.VXLAN_OVERHEAD_BYTES} needed: set spec.network.mtu "
                f"to {short.most()} or less, or give the nodes' network an MTU of "
                f"{topo.mtu + overlay.VXLAN_OVERHEAD_BYTES} (kind: its Docker network, as "
                "scripts/kind-up.sh makes it)")
    stale = [n for n in [topo.spine_netns] + [r.netns for r in topo.racks]
             if netns.exists(n)]
    for name in stale:   # left by a first pod that failed to wire half-way: rebuild
        netns.remove(name)
    network = build.build_fabric(topo, here, has_netem, droppers=dropper)
    fabric = Fabric(namespace=namespace, job=job, node=node, network=network)
    try:
        if len(spines) > 1:
            me = spines.pop(node)
            # The peers are the nodes of the job's placement, and only they: the
            # VXLAN goes to them and is accepted from them alone.
            assert overlay_id is not None   # (checked above)
            fabric.overlay_vni = overlay_id   # (set first: a failure half-way is undone)
            network.applied[f"{topo.spine_netns}/{overlay.VXLAN_IF}"] = overlay.join(
                topo.spine_netns, job.name, overlay_id, me, list(spines.values()), topo.mtu)
        if _cadentflow(job):
            fabric.enforcement = enforce.apply_to(
                [e for r in here for e in enforce.uplink_egresses(topo, r)],
                job.spec.scheduling, topo.mtu)
        fabric.tor = innetwork.create(job, tor or {}, network, racks=[r.index for r in here])
        for feature in fabric.tor:
            feature.serve_uplinks(network)
            for key, what in feature.links().items():
                network.applied[key] += f"; {what}"
    except BaseException:
        remove_fabric(fabric)
        raise
    return fabric


def fabric_namespaces(namespace: str, job: TrainingJob, node: str,
                      where: placement.Placement) -> list[str]:
    """The namespaces build_fabric makes for the job on `node`: its spine and racks."""
    topo = node_topology(job, namespace, node)
    return [topo.spine_netns] + [r.netns for r in _racks_here(job, topo, node, where)]


def adopt_fabric(namespace: str, job: TrainingJob, has_netem: bool, node: str,
                 where: placement.Placement, overlay_id: Optional[int] = None,
                 tor: Optional[innetwork.Sections] = None) -> Optional[Fabric]:
    """The fabric an earlier agent built for the job on this node, taken over as it
    is (its namespaces kept alive by the holder), or None where it cannot be: a
    namespace or uplink missing, or ToR programs (their state was the old agent's
    process's), which build_fabric then builds anew. What is the old agent's stays
    with it: its classifiers' and droppers' counts (the programs keep running)."""
    if tor:
        return None
    topo = node_topology(job, namespace, node)
    here = _racks_here(job, topo, node, where)
    network = build.adopt_fabric(topo, here, has_netem, droppers=dropper) if here else None
    if network is None:
        return None
    fabric = Fabric(namespace=namespace, job=job, node=node, network=network, adopted=True)
    if len(_spines(topo, where)) > 1:
        fabric.overlay_vni = overlay_id   # its guard in the node's namespace stays
    return fabric


def adopt_pod(fabric: Fabric, uid: str, name: str, replica: str) -> Optional[Wired]:
    """The pod as an earlier agent wired it into `fabric`, or None if its access link
    is not all there (then `wire` it)."""
    pod = fabric.network.topology.pod(replica)
    applied = build.adopt_pod(fabric.network, pod, name)
    if applied is None:
        return None
    wired = Wired(uid=uid, name=name, replica=replica, fabric=fabric, applied=applied,
                  adopted=True)
    fabric.pods[uid] = wired
    return wired


def remove_unclaimed(names: list[str]) -> None:
    """Remove namespaces of a fabric that an earlier agent built and no pod claims any
    more (its job ended while no agent ran), and the VXLAN guard of its spine."""
    vni = None
    for name in names:
        if name.endswith(".spine") and netns.exists(name):
            vni = overlay.vni_of(name)
    clean.remove([n for n in names if netns.exists(n)])
    if vni is not None:
        overlay.leave(vni)


def _racks_here(job: TrainingJob, topo: topology.Topology, node: str,
                where: placement.Placement) -> list[topology.Rack]:
    """The racks `node` builds: those holding a pod that the placement puts here (every
    one of them without a placement)."""
    occupied = placement.occupied_racks(job)
    return [r for r in topo.racks if r.name in occupied
            and (not where or r.name in where and where[r.name].name == node)]


def _spines(topo: topology.Topology, where: placement.Placement) -> dict[str, overlay.Spine]:
    """Per node of the placement (sorted by name): its spine as the others see it."""
    nodes = sorted({n.name: n for n in where.values()}.values(), key=lambda n: n.name)
    return {n.name: overlay.Spine(k, n.ip, tuple(r.subnet for r in topo.racks
                                                 if r.name in where
                                                 and where[r.name].name == n.name))
            for k, n in enumerate(nodes)}


def remove_fabric(fabric: Fabric) -> None:
    try:
        _count_uplink_drops(fabric)
        for feature in fabric.tor:
            try:
                log.info("%s/%s: %s: %s", fabric.namespace, fabric.job.name, feature.name,
                         feature.summary())
            except Exception as err:   # noqa: BLE001 -- a log line must not keep it loaded
                log.warning("%s/%s: cannot read the %s counters: %s", fabric.namespace,
                            fabric.job.name, feature.name, err)
        for error in innetwork.detach(fabric.tor):
            log.warning("%s/%s: %s", fabric.namespace, fabric.job.name, error)
    finally:
        try:
            if fabric.enforcement is not None:
                fabric.enforcement.detach()
        finally:
            try:
                build.remove_fabric(fabric.network)
            finally:
                _leave_overlay(fabric)


def _leave_overlay(fabric: Fabric) -> None:
    """Remove the guard of the job's VXLAN from the node's namespace (vx0 went with
    the spine), logging what it refused."""
    if fabric.overlay_vni is None:
        return
    dropped = overlay.leave(fabric.overlay_vni)
    fabric.overlay_vni = None
    if dropped:
        log.warning("%s/%s: the VXLAN's guard dropped %d packets from addresses that are "
                    "not the job's nodes", fabric.namespace, fabric.job.name, dropped)


def _count_uplink_drops(fabric: Fabric) -> None:
    """Add what the uplinks' full queues dropped to the agent's metrics (the pods'
    access links were counted as each was released), and log it."""
    try:
        drops = fabric.network.queue_drops()   # the uplinks: no pod is wired any more
    except Exception as err:   # noqa: BLE001 -- a counter must not keep a fabric built
        log.warning("%s/%s: cannot read the uplinks' queue drops: %s", fabric.namespace,
                    fabric.job.name, err)
        return
    metrics.queue_drops.inc(sum(drops.values()))
    if any(drops.values()):
        log.info("%s/%s: uplink queue drops: %s", fabric.namespace, fabric.job.name,
                 ", ".join(f"{readable(fabric, {}, k)} {v}" for k, v in drops.items()))


def _cadentflow(job: TrainingJob) -> bool:
    return job.spec.scheduling is not None and job.spec.scheduling.policy == "cadentflow"


def wire(fabric: Fabric, uid: str, name: str, replica: str, replace: bool = False) -> Wired:
    """Wire the pod whose namespace is named `name` into its rack: both directions of
    its access link shaped, cadentflow's classes on both ends. All or nothing.
    `replace`: first remove an access link an earlier agent may have left half made."""
    topo = fabric.network.topology
    pod = topo.pod(replica)
    if not netns.exists(topo.racks[pod.rack].netns):
        raise AgentError(f"{replica} belongs to rack {topo.racks[pod.rack].name}, which is "
                         "placed on another node (the job's status.placement)")
    if replace:
        build.unwire_pod(fabric.network, pod)
    wired = Wired(uid=uid, name=name, replica=replica, fabric=fabric)
    wired.applied = build.wire_pod(fabric.network, pod, name)
    try:
        if _cadentflow(fabric.job):
            wired.enforcement = enforce.apply_to(
                enforce.access_egresses(topo, pod, name, DATA_IF), fabric.job.spec.scheduling,
                topo.mtu)
            for key, classes in wired.enforcement.applied.items():
                wired.applied[key] += f"; {fabric.job.spec.scheduling.policy}: {classes}"
        innetwork.serve_pod(fabric.tor, fabric.network, pod)   # all or nothing
    except BaseException:
        build.unwire_pod(fabric.network, pod)
        raise
    fabric.pods[uid] = wired
    return wired


def unwire(wired: Wired) -> None:
    """Undo `wire`: the classifiers detached, the access link removed (tc0 and its
    qdiscs and filters go with it). Each step runs even if an earlier one failed."""
    wired.fabric.pods.pop(wired.uid, None)
    fabric = wired.fabric
    pod = fabric.network.topology.pod(wired.replica)
    try:
        innetwork.release_pod(fabric.tor, fabric.network, pod)
    finally:
        try:
            if wired.enforcement is not None:
                wired.enforcement.detach()
        finally:
            build.unwire_pod(fabric.network, pod)


def queue_drops(wired: Wired) -> tuple[dict[str, int], dict[str, int]]:
    """The packets the full queues of the pod's access link (both ends) and of its
    rack's uplink (both ends, shared with the rack's other pods) dropped so far, each
    by readable link end ('worker-0/tc0', 'rack-0/up')."""
    network = wired.fabric.network
    topo = network.topology
    pod = topo.pod(wired.replica)
    access = [f"{ns}/{ifname}" for ns, ifname, _ in
              enforce.access_egresses(topo, pod, wired.name, DATA_IF)]
    uplink = [f"{ns}/{ifname}" for ns, ifname, _ in
              enforce.uplink_egresses(topo, topo.racks[pod.rack])]
    drops = network.queue_drops(access + uplink)
    names = {wired.name: wired.replica}

    def named(ends: list[str]) -> dict[str, int]:
        return {readable(wired.fabric, names, e): drops[e] for e in ends if e in drops}
    return named(access), named(uplink)


def classified(wired: Wired) -> str:
    """The classifier's per-level packet counts, for the log line at release."""
    if wired.enforcement is None:
        return ""
    parts = [f"{'untagged' if level is None else f'level {level}'} {packets}"
             for by_level in wired.enforcement.counts().values()
             for level, (packets, _) in sorted(by_level.items(),
                                               key=lambda kv: (kv[0] is None, kv[0] or 0))
             if packets]
    return "; packets classified: " + (", ".join(parts) or "none")


def count_classified(wired: Wired) -> None:
    """Add the classifier's per-level packet counts to the agent's metrics."""
    if wired.enforcement is None:
        return
    for by_level in wired.enforcement.counts().values():
        for level, (packets, _) in by_level.items():
            if packets:
                metrics.classified_packets.labels(
                    level="untagged" if level is None else str(level)).inc(packets)
