"""The node agent: builds each job's network on its node and wires the job's pods in.

Runs on every node (a DaemonSet with hostPID and the capabilities listed in the
chart's values.yaml). It watches the tailcut pods scheduled to its node and acts only
for those a TrainingJob controls, building only from that TrainingJob: its spec and the
placement the operator recorded in its status (tailcut.k8s.admission says exactly what
is checked). When the first pod of a job is running there, it builds that job's spine and racks on the node
(namespaces, ToR bridges, uplinks shaped both ways) from the same topology plan and
with the same code as `tailcut run` (tailcut.net.topology, tailcut.net.build). Then
for each of the job's pods as it runs, it finds a process of the pod by the pod's UID
in /proc/<pid>/cgroup, gives that process's network namespace a name (a bind mount
under /run/netns, as `ip netns attach` does, but only inside the agent's own mount
namespace) and wires the pod into its rack through a second interface, tc0, with the
pod's address of the plan (as meshnet-cni and Multus add interfaces; the CNI's eth0
keeps the default route for DNS and the API server). Both directions of the access
link are shaped, and with spec.scheduling.policy cadentflow both ends of every link
get the HTB priority classes and the DSCP classifier (tailcut.scheduling.enforce), as
under `tailcut run`. What was applied goes on the pod as the annotation
tailcut.dev/network; the operator gathers it into the job's status.network. When the
pod ends, the packets its links' full queues dropped (both ends of its access link and
of its rack's uplink, so far) go on it as tailcut.dev/queue-drops, which the operator
gathers into status.queueDrops (network.json's queue_drops under `tailcut run`). Both
are written through the pod's status subresource: the agent may not patch pods, so it
cannot change what any pod runs.

When the pod goes (deleted, Succeeded or Failed, or missing when the agent relists)
the agent removes its access link (and with it tc0 and their filters) and drops the
name; when the last pod of a job on the node has gone, it removes the job's spine and
racks. On SIGTERM it does all of that for every job. The job's namespaces are named
only inside the agent's mount namespace, so an agent killed outright takes them with
it: the kernel frees a namespace no name and no process holds, and with it the
veths into the pods.

Names: tck8s-<first 12 characters of the pod UID> for a pod,
tck8s-<namespace>.<job>@<node>.rack-<r> and .spine for a job's fabric. Not "tailcut-":
`tailcut clean` would otherwise take them for leftovers of a local run.

The operator never touches netlink; this is the one privileged place.
"""

import ctypes
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from tailcut import features, innetwork
from tailcut.errors import NoKernelHeaders, TailcutError
from tailcut.k8s import admission, crd, metrics, placement, resources
from tailcut.net import build, naming, netns, overlay, topology
from tailcut.scheduling import enforce
from tailcut.spec.model import TrainingJob

PREFIX = "tck8s-"
DATA_IF = naming.DATA_IF
MS_BIND = 4096
_libc = ctypes.CDLL(None, use_errno=True)
log = logging.getLogger("tailcut.agent")


class AgentError(TailcutError):
    """A pod could not be wired; the message names the pod and the reason."""


class NodeUnfit(AgentError):
    """This node cannot carry the job as specified (its network's MTU); retrying will
    not help, so the job fails at once (resources.ANNOTATION_NODE_UNFIT)."""


# What no retry mends: the operator fails the job at once, with the agent's words.
UNFIT = (NodeUnfit, NoKernelHeaders)


def netns_name(pod_uid: str) -> str:
    return PREFIX + pod_uid.replace("-", "")[:12]


def pid_of_pod(pod_uid: str, proc: Path = Path("/proc")) -> Optional[int]:
    """A process of the pod, found by its UID in the cgroup path. cgroupfs drivers
    write the UID with dashes, systemd's with underscores."""
    wanted = (pod_uid, pod_uid.replace("-", "_"))
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroup = (entry / "cgroup").read_text()
        except OSError:
            continue  # the process ended meanwhile, or is not ours to read
        if any(w in cgroup for w in wanted):
            return int(entry.name)
    return None


def attach(name: str, pid: int) -> None:
    """Name the network namespace of `pid` (replacing a stale name)."""
    os.makedirs(netns.RUN_DIR, exist_ok=True)
    target = netns.path(name)
    detach(name)
    os.close(os.open(target, os.O_RDONLY | os.O_CREAT, 0))
    if _libc.mount(f"/proc/{pid}/ns/net".encode(), target.encode(), b"none", MS_BIND,
                   None) != 0:
        err = ctypes.get_errno()
        os.unlink(target)
        raise AgentError(f"cannot name the network namespace of pid {pid}: "
                         f"{os.strerror(err)}")


def detach(name: str) -> None:
    """Drop the name; already gone is fine."""
    netns.remove(name)


def fabric_name(namespace: str, job: str, node: str) -> str:
    """The prefix of a job's spine and rack namespaces on a node. The node's name is
    in it because agents of several nodes may share a mount namespace (nodes that are
    network namespaces of one host, as in the tests)."""
    return f"{PREFIX}{namespace}.{job}@{node}"


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
                 where: placement.Placement,
                 vnis_taken: Optional[dict[int, str]] = None,
                 tor: Optional[innetwork.Sections] = None) -> Fabric:
    """The job's spine and the racks placed on `node` (all of them without a
    placement), with cadentflow's classes on both ends of every uplink, the VXLAN
    to the job's spines on other nodes (refused if its VNI is one of `vnis_taken`,
    another job's on this node), and the ToR programs of `tor` (the sections the
    operator resolved, tailcut.plan.in_network) serving the racks' uplinks. Call it
    from the node's network namespace. All or nothing."""
    topo = node_topology(job, namespace, node)
    here = [r for r in topo.racks if not where or where[r.name].name == node]
    if not here:
        raise AgentError(f"{namespace}/{job.name}: no rack of the job is placed on node "
                         f"{node} ({', '.join(f'{r}: {n.name}' for r, n in where.items())})")
    vni = overlay.vni(f"{namespace}/{job.name}")
    if len(_spines(topo, where)) > 1 and vni in (vnis_taken or {}):
        raise AgentError(f"{namespace}/{job.name}: its VXLAN's VNI {vni} (a hash of its "
                         f"name) is also {(vnis_taken or {})[vni]}'s on this node; rename "
                         "one of the jobs")
    spines = _spines(topo, where)
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
    network = build.build_fabric(topo, here, has_netem)
    fabric = Fabric(namespace=namespace, job=job, node=node, network=network)
    try:
        if len(spines) > 1:
            me = spines.pop(node)
            # The peers are the nodes of the job's placement, and only they: the
            # VXLAN goes to them and is accepted from them alone.
            fabric.overlay_vni = vni   # (set first: a failure half-way is undone too)
            network.applied[f"{topo.spine_netns}/{overlay.VXLAN_IF}"] = overlay.join(
                topo.spine_netns, job.name, vni, me, list(spines.values()), topo.mtu)
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


def _spines(topo: topology.Topology, where: placement.Placement) -> dict[str, overlay.Spine]:
    """Per node of the placement (sorted by name): its spine as the others see it."""
    nodes = sorted({n.name: n for n in where.values()}.values(), key=lambda n: n.name)
    return {n.name: overlay.Spine(k, n.ip, tuple(r.subnet for r in topo.racks
                                                 if where[r.name].name == n.name))
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


def wire(fabric: Fabric, uid: str, name: str, replica: str) -> Wired:
    """Wire the pod whose namespace is named `name` into its rack: both directions of
    its access link shaped, cadentflow's classes on both ends. All or nothing."""
    topo = fabric.network.topology
    pod = topo.pod(replica)
    if not netns.exists(topo.racks[pod.rack].netns):
        raise AgentError(f"{replica} belongs to rack {topo.racks[pod.rack].name}, which is "
                         "placed on another node (the job's status.placement)")
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


WATCH_S = 300   # the API server ends each watch after this long; the agent re-lists
ANNOTATION_NETWORK = resources.ANNOTATION_NETWORK
ANNOTATION_QUEUE_DROPS = resources.ANNOTATION_QUEUE_DROPS
ANNOTATION_WIRING_ERROR = resources.ANNOTATION_WIRING_ERROR
ANNOTATION_NODE_UNFIT = resources.ANNOTATION_NODE_UNFIT
WIRING_ERROR_MAX_CHARS = 1024


class Agent:
    """Follows the tailcut pods of one node: builds each job's fabric once, wires each
    pod once, and undoes both when they go."""

    def __init__(self, core: Any, jobs: Any, node: str,
                 shape_host_network: bool = False) -> None:
        self.core = core   # CoreV1Api: the node's pods
        self.jobs = jobs   # CustomObjectsApi: their TrainingJobs
        self.node = node
        self.shape_host_network = shape_host_network
        self.has_netem = features.netem().available
        self.fabrics: dict[tuple[str, str], Fabric] = {}   # by (namespace, job)
        self.wired: dict[str, Wired] = {}                    # by pod UID
        self.failures: dict[str, str] = {}   # by pod UID: the last failure recorded on it

    def handle(self, event_type: str, pod: Any) -> None:
        uid = pod.metadata.uid
        if event_type == "DELETED" or (pod.status and pod.status.phase in ("Succeeded", "Failed")):
            self.release(uid, report=event_type != "DELETED")
            return
        if uid in self.wired or not pod.status or pod.status.phase != "Running":
            return
        where = f"{pod.metadata.namespace}/{pod.metadata.name}"
        if pod.spec.host_network and not self.shape_host_network:
            log.warning(f"{where}: on the host network; not wired (its second interface "
                        "would be the node's; set agent.dangerouslyShapeHostNetworkPods "
                        "to allow)")
            return
        ok = self.admit(pod)
        pid = pid_of_pod(uid)
        if pid is None:
            log.warning(f"{where}: running but no process found in /proc; retrying later")
            return
        try:
            wired = self._wire(pod.metadata.namespace, ok.job, ok.racks_at, ok.job_uid, uid,
                               ok.replica, pid, ok.tor)
            wired.where = where
        except Exception as err:
            metrics.shaping_failures.inc()
            # On the pod, for the operator to put in the job's status and an Event:
            # the agent's log is not where a job's owner looks.
            said = f"node {self.node}: {type(err).__name__}: {err}"[:WIRING_ERROR_MAX_CHARS]
            if self.failures.get(uid) != said:   # each new failure once (the patch is
                self.failures[uid] = said        # itself an event that retries wiring)
                self._record(pod, {ANNOTATION_WIRING_ERROR: said, **(
                    {ANNOTATION_NODE_UNFIT: said} if isinstance(err, UNFIT) else {})})
            raise
        wired.pod_name = pod.metadata.name
        metrics.pods_shaped_total.inc()
        metrics.pods_shaped.set(len(self.wired))
        log.info(f"{where}: {wired.description}")
        self._annotate(pod, wired)

    def admit(self, pod: Any) -> admission.Admitted:
        """What to wire `pod` with, from the TrainingJob that controls it; raises
        admission.Refused (naming the pod and why) for any other pod."""
        ref = admission.controller(pod)
        try:
            job = self.jobs.get_namespaced_custom_object(
                crd.GROUP, crd.VERSION, pod.metadata.namespace, crd.PLURAL, ref.name)
        except Exception as err:
            if getattr(err, "status", None) != 404:
                raise
            job = None
        return admission.admit(pod, job)

    def _wire(self, namespace: str, job: TrainingJob, where: placement.Placement,
              job_uid: str, uid: str, replica: str, pid: int,
              tor: Optional[innetwork.Sections] = None) -> Wired:
        key = (namespace, job.name)
        fabric = self.fabrics.get(key)
        if fabric is not None and fabric.job_uid != job_uid:
            # The job was deleted and created again while the old one's pods were
            # still going: theirs is a dead job's fabric.
            for old in list(fabric.pods):
                self.release(old)
            fabric = self.fabrics.get(key)
        if fabric is None:
            fabric = build_fabric(namespace, job, self.has_netem, self.node, where, {
                f.overlay_vni: f"{ns}/{name}" for (ns, name), f in self.fabrics.items()
                if f.overlay_vni is not None}, tor=tor)
            fabric.job_uid = job_uid
            self.fabrics[key] = fabric
            log.info(f"{namespace}/{job.name}: built the spine and the racks placed here: "
                     + "; ".join(f"{readable(fabric, {}, k)}: {v}"
                                 for k, v in fabric.network.applied.items()))
        name = netns_name(uid)
        try:
            attach(name, pid)
            try:
                wired = wire(fabric, uid, name, replica)
            except BaseException:
                detach(name)
                raise
        except BaseException:
            self._drop_fabric_if_unused(key)
            raise
        self.wired[uid] = wired
        return wired

    def _annotate(self, pod: Any, wired: Wired) -> None:
        """Record on the pod what its links got (the operator reads it into the
        job's status); a failure to record is logged, the wiring stays."""
        names = {wired.name: wired.replica}
        links = {readable(wired.fabric, names, k): v for k, v in
                 list(wired.applied.items()) + list(self._uplinks_of(wired).items())}
        # (a failure to wire it before, now passed, is no longer news)
        failed_before = self.failures.pop(pod.metadata.uid, None) is not None
        self._record(pod, {ANNOTATION_NETWORK: json.dumps(links),
                           **({ANNOTATION_WIRING_ERROR: None} if failed_before else {})})

    def _record(self, pod: Any, annotations: dict[str, Optional[str]]) -> None:
        """Set (None: remove) annotations on the pod; a failure is logged."""
        try:
            # Through the status subresource: it cannot touch the pod's spec or owners.
            self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {
                "metadata": {"annotations": annotations}})
        except Exception as err:   # noqa: BLE001 - the API's errors are many; log them
            log.warning(f"{pod.metadata.namespace}/{pod.metadata.name}: could not record "
                        f"{', '.join(annotations)} on the pod: {err}")

    @staticmethod
    def _uplinks_of(wired: Wired) -> dict[str, str]:
        """What the uplink of the pod's rack got, both ends, and its spine's VXLAN."""
        network = wired.fabric.network
        topo = network.topology
        rack = topo.racks[topo.pod(wired.replica).rack]
        ends = [f"{ns}/{ifname}" for ns, ifname, _ in enforce.uplink_egresses(topo, rack)]
        enforced = wired.fabric.enforcement.applied if wired.fabric.enforcement else {}
        links = {end: network.applied[end] + (f"; cadentflow: {enforced[end]}"
                                              if end in enforced else "")
                 for end in ends if end in network.applied}
        vxlan = network.applied.get(f"{topo.spine_netns}/{overlay.VXLAN_IF}")
        if vxlan is not None:   # each node's spine has one: named by its node
            links[f"spine@{wired.fabric.node}/{overlay.VXLAN_IF}"] = vxlan
        return links

    def release(self, uid: str, report: bool = True) -> None:
        """Unwire the pod, drop its name, and remove its job's fabric if it was the
        job's last pod on this node. Nothing wired is fine. The queue drops of its
        links are read first; with `report` they go on the pod for the job's status
        (a pod already deleted has nowhere to keep them)."""
        self.failures.pop(uid, None)
        wired = self.wired.pop(uid, None)
        if wired is None:
            return
        count_classified(wired)
        drops = self._queue_drops(wired, report)
        try:
            unwire(wired)
        finally:
            detach(wired.name)
            self._drop_fabric_if_unused((wired.fabric.namespace, wired.fabric.job.name))
            metrics.pods_shaped.set(len(self.wired))
        log.info(f"{wired.where}: released {wired.replica}{classified(wired)}; queue "
                 f"drops: {', '.join(f'{k} {v}' for k, v in drops.items()) or 'none read'}")

    def _queue_drops(self, wired: Wired, report: bool) -> dict[str, int]:
        """Read the queue drops of the pod's links (before they go), count its access
        link's in the metrics and, with `report`, record them all on the pod. A
        failure is logged: it must not keep the pod wired."""
        try:
            access, uplink = queue_drops(wired)
        except Exception as err:   # noqa: BLE001 -- netlink's errors are many; log them
            log.warning(f"{wired.where}: cannot read its links' queue drops: {err}")
            return {}
        metrics.queue_drops.inc(sum(access.values()))
        drops = {**access, **uplink}
        if report and wired.pod_name:
            try:
                self.core.patch_namespaced_pod_status(wired.pod_name, wired.fabric.namespace, {
                    "metadata": {"annotations": {ANNOTATION_QUEUE_DROPS: json.dumps(drops)}}})
            except Exception as err:   # noqa: BLE001 - the API's errors are many; log them
                log.warning(f"{wired.where}: could not record its queue drops on the pod: "
                            f"{err}")
        return drops

    def _drop_fabric_if_unused(self, key: tuple[str, str]) -> None:
        fabric = self.fabrics.get(key)
        if fabric is not None and not fabric.pods:
            del self.fabrics[key]
            remove_fabric(fabric)
            log.info(f"{key[0]}/{key[1]}: no pod left on this node: spine and racks removed")

    def release_all(self) -> None:
        """Unwire every pod and remove every fabric (the agent is stopping)."""
        for uid in list(self.wired):
            try:
                self.release(uid)
            except TailcutError as err:
                log.error(f"pod {uid}: {err}")
        for key in list(self.fabrics):   # a fabric whose first pod failed to wire
            remove_fabric(self.fabrics.pop(key))

    def events(self) -> Iterator[tuple[str, Any]]:
        """The node's tailcut pods as they are now (ADDED), then their changes. Lists
        from the API server's watch cache (resourceVersion 0) and watches from the
        version that list returned: a version read from etcd can be ahead of the cache,
        and the watch then fails with "Too large resource version"."""
        import kubernetes
        selectors = {"label_selector": resources.LABEL_JOB,
                     "field_selector": f"spec.nodeName={self.node}"}
        listed = self.core.list_pod_for_all_namespaces(resource_version="0", **selectors)
        present = {pod.metadata.uid for pod in listed.items}
        for uid in [u for u in self.wired if u not in present]:
            self.release(uid, report=False)   # went away while the watch was down
        for pod in listed.items:
            yield "ADDED", pod
        watch = kubernetes.watch.Watch()
        for event in watch.stream(self.core.list_pod_for_all_namespaces,
                                  resource_version=listed.metadata.resource_version,
                                  allow_watch_bookmarks=True, timeout_seconds=WATCH_S,
                                  **selectors):
            if event["type"] != "BOOKMARK":
                yield event["type"], event["object"]


def main() -> int:
    import kubernetes
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    node = os.environ.get("NODE_NAME")
    if not node:
        print("tailcut agent: NODE_NAME is not set (the DaemonSet sets it from "
              "spec.nodeName)", file=sys.stderr)
        return 2
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    agent = Agent(kubernetes.client.CoreV1Api(), kubernetes.client.CustomObjectsApi(), node,
                  os.environ.get("TAILCUT_SHAPE_HOST_NETWORK", "false") == "true")
    signal.signal(signal.SIGTERM, _stop)   # the DaemonSet's pod is deleted or rolled
    last_seen = [time.monotonic()]
    # Healthy while the watch delivers: a list, events, or its bookmarks and reconnects
    # at least every WATCH_S.
    port = int(os.environ.get("TAILCUT_METRICS_PORT", "0"))   # the chart sets it
    if port:
        metrics.serve(metrics.agent_registry, port,
                      healthy=lambda: time.monotonic() - last_seen[0] < 3 * WATCH_S)
    try:
        while True:
            last_seen[0] = time.monotonic()
            try:
                for event_type, pod in agent.events():
                    last_seen[0] = time.monotonic()
                    try:
                        agent.handle(event_type, pod)
                    except admission.Refused as err:   # it names the pod itself
                        log.warning(str(err))
                    except TailcutError as err:
                        log.error(f"{pod.metadata.namespace}/{pod.metadata.name}: {err}")
                    except Exception:   # noqa: BLE001 - one pod must not end the agent
                        # (and with it every job's links on the node): log, go on.
                        log.exception(f"{pod.metadata.namespace}/{pod.metadata.name}: "
                                      "not wired")
            except kubernetes.client.ApiException as err:
                log.warning(f"watch ended: {err.status} {err.reason}; reconnecting")
                time.sleep(2)
    except KeyboardInterrupt:
        pass
    finally:
        # Leave no link, classifier or dropper of ours in pods the next agent may
        # never see (the chart uninstalled); one that comes back wires them again.
        agent.release_all()
    return 0


def _stop(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
