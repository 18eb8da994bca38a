"""The agent's loop over its node's pods: each job's fabric built once, each pod
admitted (tailcut.k8s.agent.admission) and wired once, both undone when they go, and
what its links got recorded on the pod for the operator."""

import hashlib
import json
import logging
import os
import time
from typing import Any, Iterator, Optional

from tailcut import features
from tailcut.errors import TailcutError
from tailcut.k8s import metrics
from tailcut.k8s.agent import admission, holder, podns, wiring
from tailcut.k8s.agent.errors import UNFIT, AgentError
from tailcut.k8s.manifests import crd, resources
from tailcut.net import netns, overlay
from tailcut.scheduling import enforce

log = logging.getLogger("tailcut.agent")

WATCH_S = 300   # the API server ends each watch after this long; the agent re-lists
ANNOTATION_NETWORK = resources.ANNOTATION_NETWORK
ANNOTATION_QUEUE_DROPS = resources.ANNOTATION_QUEUE_DROPS
ANNOTATION_WIRING_ERROR = resources.ANNOTATION_WIRING_ERROR
ANNOTATION_NODE_UNFIT = resources.ANNOTATION_NODE_UNFIT
ANNOTATION_REFUSED = resources.ANNOTATION_REFUSED
WIRING_ERROR_MAX_CHARS = 1024


class Agent:
    """Follows the tailcut pods of one node: builds each job's fabric once, wires each
    pod once, and undoes both when they go."""

    def __init__(self, core: Any, jobs: Any, node: str,
                 shape_host_network: bool = False,
                 keeper: Optional[holder.Client] = None) -> None:
        self.core = core   # CoreV1Api: the node's pods
        self.jobs = jobs   # CustomObjectsApi: their TrainingJobs
        self.node = node
        self.shape_host_network = shape_host_network
        self.keeper = keeper   # the holder of the fabrics' namespaces (holder.py)
        # namespaces a predecessor built (by name: what they were built for), not yet adopted
        self.inherited: dict[str, str] = {}
        self.has_netem = features.netem().available
        self.fabrics: dict[tuple[str, str], wiring.Fabric] = {}   # by (namespace, job)
        self.wired: dict[str, wiring.Wired] = {}                    # by pod UID
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
        try:
            ok = self.admit(pod)
            containers = podns.running_container_ids(pod)
            found = podns.find_pod_process(uid, containers)
            if found is None:
                log.warning(f"{where}: running but no process found in /proc; retrying "
                            "later")
                return
            pid = found.pid
            log.info(f"{where}: process {pid}, found by {found.how}" + (
                f" (container {found.container_id[:12]})" if found.container_id
                else f" (its pod UID alone; running containers: {containers or 'none'})"))
            if podns.in_nodes_netns(pid) and not pod.spec.host_network:
                raise admission.Denied(
                    f"{where}: not wired: its process {pid} is in the node's network "
                    "namespace, not a pod's of its own (a host-network process in the "
                    "pod's cgroup?); wiring it would move the node's links")
        except admission.Denied as err:
            self._refuse(pod, err)
            raise
        try:
            # (the annotation goes on the pod once it is wired whole: only then may a
            # successor adopt its links as they are)
            recorded = ANNOTATION_NETWORK in (pod.metadata.annotations or {})
            wired = self._wire(pod.metadata.namespace, ok, uid, pid, recorded)
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
        log.info(f"{where}: {'adopted as wired: ' if wired.adopted else ''}{wired.description}")
        if not wired.adopted:   # (its annotation, written by the agent that wired it, stands)
            self._annotate(pod, wired)

    def _refuse(self, pod: Any, err: admission.Denied) -> None:
        """Record a refusal for good on the pod, once: the operator fails the job at
        once with it (its Failed condition and events), not at the pod's timeout."""
        said = f"node {self.node}: {err}"[:WIRING_ERROR_MAX_CHARS]
        if self.failures.get(pod.metadata.uid) != said:
            self.failures[pod.metadata.uid] = said
            self._record(pod, {ANNOTATION_WIRING_ERROR: said, ANNOTATION_REFUSED: said})

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

    def _wire(self, namespace: str, ok: admission.Admitted, uid: str,
              pid: int, recorded: bool = False) -> wiring.Wired:
        """Wire the pod into its job's fabric (built, or adopted from the previous
        agent); `recorded`: the pod carries the annotation of a finished wiring, so
        its links may be adopted as they are."""
        job, job_uid, replica = ok.job, ok.job_uid, ok.replica
        key = (namespace, job.name)
        fabric = self.fabrics.get(key)
        if fabric is not None and fabric.job_uid != job_uid:
            # The job was deleted and created again while the old one's pods were
            # still going: theirs is a dead job's fabric.
            for old in list(fabric.pods):
                self.release(old)
            fabric = self.fabrics.get(key)
        if fabric is None:
            fabric = self._adopt(namespace, ok) or self._build(namespace, ok)
            fabric.job_uid = job_uid
            self.fabrics[key] = fabric
        name = podns.netns_name(uid)
        try:
            podns.attach(name, pid)
            try:
                wired = (wiring.adopt_pod(fabric, uid, name, replica)
                         if fabric.adopted and recorded else None)
                if wired is None:
                    wired = wiring.wire(fabric, uid, name, replica, replace=fabric.adopted)
            except BaseException:
                podns.detach(name)
                raise
        except BaseException:
            self._drop_fabric_if_unused(key)
            raise
        self.wired[uid] = wired
        return wired

    def _build(self, namespace: str, ok: admission.Admitted) -> wiring.Fabric:
        fabric = wiring.build_fabric(
            namespace, ok.job, self.has_netem, self.node, ok.racks_at,
            overlay_id=ok.overlay_id, vnis_taken={
                f.overlay_vni: f"{ns}/{name}" for (ns, name), f in self.fabrics.items()
                if f.overlay_vni is not None}, tor=ok.tor)
        fabric.held_as = _tag(ok)
        self._hold(fabric)
        log.info(f"{namespace}/{ok.job.name}: built the spine and the racks placed here: "
                 + "; ".join(f"{wiring.readable(fabric, {}, k)}: {v}"
                             for k, v in fabric.network.applied.items()))
        return fabric

    # ---- what survives a restart of the agent (holder.py) ---------------------------

    def take_over(self) -> None:
        """Name again the namespaces a predecessor handed to the holder; each job's
        fabric is adopted when its first pod is handled (`_adopt`), and what no pod
        claims is removed after the first listing (`_remove_unclaimed`)."""
        if self.keeper is None:
            return
        try:
            held = self.keeper.held()
        except holder.HolderError as err:
            log.warning(f"{err}: the fabrics of this node's jobs are built anew")
            return
        mine = [n for n in held if n.startswith(podns.PREFIX) and f"@{self.node}." in n]
        named = []
        for name, kept in held.items():
            try:
                if name in mine:
                    # (named again even if the name is there: the agent's /run/netns
                    # outlives its container, and with it the files, not the mounts)
                    podns.attach_fd(name, kept.fd)
                    named.append(name)
            except AgentError as err:
                log.warning(f"{name}: {err}; let go (its links go with it)")
            finally:
                os.close(kept.fd)
        self._unhold([n for n in mine if n not in named])
        self.inherited = {n: held[n].tag for n in named}
        if self.inherited:
            log.info(f"took over {len(self.inherited)} namespaces of this node's jobs from "
                     "the previous agent: " + ", ".join(sorted(self.inherited)))

    def _adopt(self, namespace: str, ok: admission.Admitted) -> Optional[wiring.Fabric]:
        """The job's fabric as the previous agent built it, if it built it for this
        job as it is now (its incarnation, spec and placement)."""
        names = wiring.fabric_namespaces(namespace, ok.job, self.node, ok.racks_at)
        base = wiring.fabric_name(namespace, ok.job.name, self.node) + "."
        theirs = [n for n in self.inherited if n.startswith(base)]
        fabric = None
        if names and all(self.inherited.get(n) == _tag(ok) for n in names):
            fabric = wiring.adopt_fabric(namespace, ok.job, self.has_netem, self.node,
                                         ok.racks_at, overlay_id=ok.overlay_id, tor=ok.tor)
        for name in theirs:
            self.inherited.pop(name)
        if fabric is not None:
            fabric.held_as = _tag(ok)
        if fabric is None and theirs:
            # Built for another incarnation or spec of the job (or not adoptable): its
            # links must go before the fabric is built anew over the same pods.
            self._remove_inherited(theirs)
        if fabric is not None:
            log.info(f"{namespace}/{ok.job.name}: adopted the spine and the racks the "
                     "previous agent built here: " + "; ".join(
                         f"{wiring.readable(fabric, {}, k)}: {v}"
                         for k, v in fabric.network.applied.items()))
        return fabric

    def _remove_unclaimed(self, present: list[Any]) -> None:
        """Remove the inherited fabrics of jobs none of whose pods is on the node now."""
        claimed = {wiring.fabric_name(p.metadata.namespace, p.metadata.labels.get(
            resources.LABEL_JOB, ""), self.node) for p in present}
        by_fabric: dict[str, list[str]] = {}
        for name in self.inherited:
            by_fabric.setdefault(name.rpartition(".")[0], []).append(name)
        for base, names in by_fabric.items():
            if base in claimed:
                continue
            self._remove_inherited(names)
            log.info(f"{base}: no pod of its job is on this node any more: the fabric "
                     "the previous agent built is removed")

    def _hold(self, fabric: wiring.Fabric) -> bool:
        """Hand the fabric's namespaces to the holder (again: a holder that restarted
        holds nothing). False if it could not: the fabric works, but an agent restart
        would drop its links."""
        if self.keeper is None:
            return False
        for name in _namespaces_of(fabric):
            try:
                self.keeper.hold(name, netns.path(name), fabric.held_as)
            except (OSError, holder.HolderError) as err:
                log.warning(f"{name}: {err}; a restart of the agent would drop its links")
                return False
        return True

    def hold_all(self) -> bool:
        """Every fabric handed to the holder; whether all of them are held now."""
        return all([self._hold(fabric) for fabric in self.fabrics.values()])

    def _unhold(self, names: list[str]) -> None:
        if self.keeper is None:
            return
        for name in names:
            try:
                self.keeper.drop(name)
            except holder.HolderError as err:
                log.warning(f"{name}: {err}")

    def leaves_fabrics(self, wait_s: float = 3.0) -> bool:
        """Whether the agent, stopping, leaves its fabrics to its successor: only its
        container stops (the holder is not stopping: the pod stays), so the next
        agent adopts them and no job loses a link. The kubelet stops every container
        of a pod that goes at once; the holder may hear of it a moment later."""
        if self.keeper is None:
            return False
        deadline = time.monotonic() + wait_s
        while True:
            try:
                if self.keeper.stopping():
                    return False
            except holder.HolderError:
                return False   # nothing may be holding them: remove them
            if time.monotonic() >= deadline:
                # Handed over again, in case the holder restarted since: whatever it
                # does not hold now would be lost, so then remove everything.
                return self.hold_all()
            time.sleep(0.2)

    def _annotate(self, pod: Any, wired: wiring.Wired) -> None:
        """Record on the pod what its links got (the operator reads it into the
        job's status); a failure to record is logged, the wiring stays."""
        names = {wired.name: wired.replica}
        links = {wiring.readable(wired.fabric, names, k): v for k, v in
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
    def _uplinks_of(wired: wiring.Wired) -> dict[str, str]:
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
        wiring.count_classified(wired)
        drops = self._queue_drops(wired, report)
        try:
            wiring.unwire(wired)
        finally:
            podns.detach(wired.name)
            self._drop_fabric_if_unused((wired.fabric.namespace, wired.fabric.job.name))
            metrics.pods_shaped.set(len(self.wired))
        log.info(f"{wired.where}: released {wired.replica}{wiring.classified(wired)}; queue "
                 f"drops: {', '.join(f'{k} {v}' for k, v in drops.items()) or 'none read'}")

    def _queue_drops(self, wired: wiring.Wired, report: bool) -> dict[str, int]:
        """Read the queue drops of the pod's links (before they go), count its access
        link's in the metrics and, with `report`, record them all on the pod. A
        failure is logged: it must not keep the pod wired."""
        try:
            access, uplink = wiring.queue_drops(wired)
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
            try:
                wiring.remove_fabric(fabric)
            finally:
                self._unhold(_namespaces_of(fabric))
            log.info(f"{key[0]}/{key[1]}: no pod left on this node: spine and racks removed")

    def release_all(self) -> None:
        """Unwire every pod and remove every fabric (the agent is stopping)."""
        for uid in list(self.wired):
            try:
                self.release(uid)
            except TailcutError as err:
                log.error(f"pod {uid}: {err}")
        for key in list(self.fabrics):   # a fabric whose first pod failed to wire
            fabric = self.fabrics.pop(key)
            try:
                wiring.remove_fabric(fabric)
            finally:
                self._unhold(_namespaces_of(fabric))
        self._remove_inherited(list(self.inherited))   # taken over, never claimed

    def _remove_inherited(self, names: list[str]) -> None:
        for name in names:
            self.inherited.pop(name, None)
        if not names:
            return
        try:
            wiring.remove_unclaimed(names)
        finally:
            self._unhold(names)

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
        try:
            self._remove_unclaimed([p for p in listed.items if not p.status
                                    or p.status.phase not in ("Succeeded", "Failed")])
        except Exception as err:   # noqa: BLE001 - netlink's errors are many; not fatal
            log.warning(f"cannot remove the fabrics no pod claims: {err}")
        if self.keeper is not None and not self.hold_all():   # (a holder restarted alone)
            log.warning("the holder does not hold every fabric: an agent restart now "
                        "would drop their links")
        watch = kubernetes.watch.Watch()
        for event in watch.stream(self.core.list_pod_for_all_namespaces,
                                  resource_version=listed.metadata.resource_version,
                                  allow_watch_bookmarks=True, timeout_seconds=WATCH_S,
                                  **selectors):
            if event["type"] != "BOOKMARK":
                yield event["type"], event["object"]


def _tag(ok: admission.Admitted) -> str:
    """What a fabric was built for, as the holder keeps it: the job's incarnation and a
    digest of its spec, placement, overlay id and ToR sections."""
    what = json.dumps([ok.job.spec.model_dump(mode="json"), sorted(
        (r, n.name, n.ip) for r, n in ok.racks_at.items()), ok.overlay_id, ok.tor],
        sort_keys=True, default=str)
    return f"{ok.job_uid}:{hashlib.sha256(what.encode()).hexdigest()[:16]}"


def _namespaces_of(fabric: wiring.Fabric) -> list[str]:
    topo = fabric.network.topology
    return [topo.spine_netns] + [topo.racks[i].netns for i in fabric.network.racks]
