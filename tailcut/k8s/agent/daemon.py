"""The agent's loop over its node's pods: each job's fabric built once, each pod
admitted (tailcut.k8s.agent.admission) and wired once, both undone when they go, and
what its links got recorded on the pod for the operator."""

import json
import logging
from typing import Any, Iterator, Optional

from tailcut import features
from tailcut.errors import TailcutError
from tailcut.k8s import metrics
from tailcut.k8s.agent import admission, podns, wiring
from tailcut.k8s.agent.errors import UNFIT
from tailcut.k8s.manifests import crd, resources
from tailcut.net import overlay
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
                 shape_host_network: bool = False) -> None:
        self.core = core   # CoreV1Api: the node's pods
        self.jobs = jobs   # CustomObjectsApi: their TrainingJobs
        self.node = node
        self.shape_host_network = shape_host_network
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
            pid = podns.pid_of_pod(uid)
            if pid is None:
                log.warning(f"{where}: running but no process found in /proc; retrying "
                            "later")
                return
            if podns.in_nodes_netns(pid) and not pod.spec.host_network:
                raise admission.Denied(
                    f"{where}: not wired: its process {pid} is in the node's network "
                    "namespace, not a pod's of its own (a host-network process in the "
                    "pod's cgroup?); wiring it would move the node's links")
        except admission.Denied as err:
            self._refuse(pod, err)
            raise
        try:
            wired = self._wire(pod.metadata.namespace, ok, uid, pid)
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
              pid: int) -> wiring.Wired:
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
            fabric = wiring.build_fabric(
                namespace, job, self.has_netem, self.node, ok.racks_at,
                overlay_id=ok.overlay_id, vnis_taken={
                    f.overlay_vni: f"{ns}/{name}" for (ns, name), f in self.fabrics.items()
                    if f.overlay_vni is not None}, tor=ok.tor)
            fabric.job_uid = job_uid
            self.fabrics[key] = fabric
            log.info(f"{namespace}/{job.name}: built the spine and the racks placed here: "
                     + "; ".join(f"{wiring.readable(fabric, {}, k)}: {v}"
                                 for k, v in fabric.network.applied.items()))
        name = podns.netns_name(uid)
        try:
            podns.attach(name, pid)
            try:
                wired = wiring.wire(fabric, uid, name, replica)
            except BaseException:
                podns.detach(name)
                raise
        except BaseException:
            self._drop_fabric_if_unused(key)
            raise
        self.wired[uid] = wired
        return wired

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
            wiring.remove_fabric(fabric)
            log.info(f"{key[0]}/{key[1]}: no pod left on this node: spine and racks removed")

    def release_all(self) -> None:
        """Unwire every pod and remove every fabric (the agent is stopping)."""
        for uid in list(self.wired):
            try:
                self.release(uid)
            except TailcutError as err:
                log.error(f"pod {uid}: {err}")
        for key in list(self.fabrics):   # a fabric whose first pod failed to wire
            wiring.remove_fabric(self.fabrics.pop(key))

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
