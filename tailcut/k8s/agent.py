"""The node agent: shapes each tailcut pod's link from inside its network namespace.

Runs on every node (a DaemonSet with hostPID and the capabilities listed in the
chart's values.yaml). It watches the tailcut pods scheduled to its node; when one is
running it finds a process of the pod by the pod's UID in /proc/<pid>/cgroup, gives
that process's network namespace a name (a bind mount under /run/netns, as `ip netns
attach` does, but only inside the agent's own mount namespace) and applies the job's
access-link shaping to the pod's eth0 with the same code the local runtime uses
(tailcut.net.shaping.plan/apply). When the job's spec.scheduling.policy is cadentflow
it adds what the local runtime adds on every pod: the HTB priority classes and the DSCP
classifier on that eth0 (tailcut.scheduling.enforce.apply_to), so the pods' per-tensor
DSCP tags pick their class.

When the pod goes (deleted, Succeeded or Failed, or missing when the agent relists)
the agent undoes what it applied while the namespace may still be there (a finished
pod's sandbox can outlive it): it detaches the classifier and the loss dropper (BPF
filters; the agent's BCC program goes with its last attachment), deletes the HTB tree
with its priority classes (shaping.remove), then drops the name. On SIGTERM it releases
every pod the same way. A pod whose eth0 still carries tailcut filters from an agent
that was killed (SIGKILL) is cleared of them before it is shaped again.

Names: tck8s-<first 12 characters of the pod UID>. Not "tailcut-": `tailcut clean`
would otherwise end the pod's processes as leftovers of a local run.

The operator never touches netlink; this is the one privileged place.
"""

import ctypes
import errno
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import yaml

from tailcut import features, spec
from tailcut.errors import TailcutError
from tailcut.k8s import metrics, policy, resources
from tailcut.net import netns, shaping
from tailcut.scheduling import enforce
from tailcut.spec.model import Link, Scheduling, TrainingJob

PREFIX = "tck8s-"
POD_IF = "eth0"
MS_BIND = 4096
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)
log = logging.getLogger("tailcut.agent")


class AgentError(TailcutError):
    """A pod could not be shaped; the message names the pod and the reason."""


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


@dataclass
class Shaped:
    name: str
    description: str
    droppers: list[object] = field(default_factory=list)
    enforcement: Optional[enforce.Enforcement] = None


def shape(name: str, link: Link, has_netem: bool,
          scheduling: Optional[Scheduling] = None) -> Shaped:
    """Apply `link`'s shaping to eth0 in namespace `name`: the pod's egress, and for
    `scheduling.policy` cadentflow the priority classes and classifier on top. (The
    other direction is shaped where the local runtime shapes it too: on the peer end,
    which on Kubernetes belongs to the CNI, so only egress is ours.) All or nothing:
    if a step fails, what the earlier ones applied is removed again."""
    ops = shaping.plan(link, has_netem, "spec.network.accessLink")
    shaped = Shaped(name=name, description=shaping.describe(ops))
    try:
        with netns.ipr(name) as ipr:
            if not ipr.link_lookup(ifname=POD_IF):
                raise AgentError(f"{name}: no {POD_IF} in the pod's network namespace")
            clear_stale_filters(ipr, name)
            shaped.droppers = shaping.apply(ops, ipr, name, POD_IF)
        if scheduling is not None and scheduling.policy == "cadentflow":
            shaped.enforcement = enforce.apply_to([(name, POD_IF, link.bandwidth)],
                                                  scheduling)
            shaped.description += (f"; {scheduling.policy}: "
                                   + "; ".join(shaped.enforcement.applied.values()))
    except BaseException:
        release(shaped)
        raise
    return shaped


def release(shaped: Shaped) -> None:
    """Undo `shape` on the pod's eth0, if the namespace is still there: classifier
    and droppers detached, HTB tree (and its priority classes) deleted. Each step
    runs even if an earlier one failed; the first error is raised at the end."""
    steps: list[Any] = [d.detach for d in shaped.droppers]  # type: ignore[attr-defined]
    if shaped.enforcement is not None:
        steps.insert(0, shaped.enforcement.detach)
    steps.append(lambda: _remove_tree(shaped.name))
    failed: Optional[BaseException] = None
    for step in steps:
        try:
            step()
        except Exception as err:   # noqa: BLE001 - the rest must still be undone
            failed = failed or err
    if failed is not None:
        raise failed


def _remove_tree(name: str) -> None:
    try:
        with netns.ipr(name) as ipr:
            shaping.remove(ipr, POD_IF)
    except TailcutError:
        pass   # the name or the namespace is gone, and the qdiscs with it


def unshape(shaped: Shaped) -> None:
    """Release the pod and drop its name, even if releasing failed half-way."""
    try:
        release(shaped)
    finally:
        detach(shaped.name)


def classified(shaped: Shaped) -> str:
    """The classifier's per-level packet counts, for the log line at release."""
    if shaped.enforcement is None:
        return ""
    parts = [f"{'untagged' if level is None else f'level {level}'} {packets}"
             for by_level in shaped.enforcement.counts().values()
             for level, (packets, _) in sorted(by_level.items(),
                                               key=lambda kv: (kv[0] is None, kv[0] or 0))
             if packets]
    return "; packets classified: " + (", ".join(parts) or "none")


def count_classified(shaped: Shaped) -> None:
    """Add the classifier's per-level packet counts to the agent's metrics."""
    if shaped.enforcement is None:
        return
    for by_level in shaped.enforcement.counts().values():
        for level, (packets, _) in by_level.items():
            if packets:
                metrics.classified_packets.labels(
                    level="untagged" if level is None else str(level)).inc(packets)


WATCH_S = 300   # the API server ends each watch after this long; the agent re-lists
TC_EGRESS = 0xFFFFFFF3
OUR_PROGRAMS = ("tailcut_",)   # names of the BPF programs tailcut attaches (ebpf/)


def clear_stale_filters(ipr: Any, name: str) -> int:
    """Delete the tailcut BPF filters an earlier agent left on the pod's eth0 egress
    (it was killed before it could release them), and the clsact qdisc if nothing else
    is left on it; they would make the classifier's attach fail with EEXIST. Filters
    of other programs are left alone. Returns how many were deleted."""
    from pyroute2 import NetlinkError

    index = ipr.link_lookup(ifname=POD_IF)[0]
    if not any(q.get_attr("TCA_KIND") == "clsact" for q in ipr.get_qdiscs(index)):
        return 0
    removed, others = 0, 0
    for f in ipr.get_filters(index, parent=TC_EGRESS):
        if not f["handle"]:
            continue   # the per-priority chain header, not a filter
        options = f.get_attr("TCA_OPTIONS")
        prog_name = options.get_attr("TCA_BPF_NAME") if options is not None else None
        if not (prog_name or "").startswith(OUR_PROGRAMS):
            others += 1
            continue
        prio = f["info"] >> 16
        try:
            ipr.tc("del-filter", "bpf", index, handle=f["handle"], parent=TC_EGRESS,
                   prio=prio)
            removed += 1
        except NetlinkError as err:
            if err.code not in (errno.ENOENT, errno.EINVAL):
                raise
    if removed:
        ingress = [f for f in ipr.get_filters(index, parent=0xFFFFFFF2) if f["handle"]]
        if not others and not ingress:
            ipr.tc("del", "clsact", index)
        log.warning(f"{name}: removed {removed} tailcut filter(s) left on {POD_IF} by an "
                    "earlier agent")
    return removed


class Agent:
    """Follows the tailcut pods of one node and keeps each one shaped once."""

    def __init__(self, core: Any, node: str, shape_host_network: bool = False) -> None:
        self.core = core
        self.node = node
        self.shape_host_network = shape_host_network
        self.has_netem = features.netem().available
        self.shaped: dict[str, Shaped] = {}

    def handle(self, event_type: str, pod: Any) -> None:
        uid = pod.metadata.uid
        if event_type == "DELETED" or (pod.status and pod.status.phase in ("Succeeded", "Failed")):
            done = self.shaped.pop(uid, None)
            if done is not None:
                count_classified(done)
                unshape(done)
                metrics.pods_shaped.set(len(self.shaped))
                log.info(f"{pod.metadata.namespace}/{pod.metadata.name}: released "
                         f"{done.name}{classified(done)}")
            return
        if uid in self.shaped or not pod.status or pod.status.phase != "Running":
            return
        where = f"{pod.metadata.namespace}/{pod.metadata.name}"
        if pod.spec.host_network and not self.shape_host_network:
            log.warning(f"{where}: on the host network; not shaped (shaping it would shape "
                        "the node; set agent.dangerouslyShapeHostNetworkPods to allow)")
            return
        job = self._job(pod)
        try:
            policy.check_enforceable(job)   # the operator refused these already
        except TailcutError as err:
            raise AgentError(f"{where}: not shaped: {err}") from err
        pid = pid_of_pod(uid)
        if pid is None:
            log.warning(f"{where}: running but no process found in /proc; retrying later")
            return
        name = netns_name(uid)
        try:
            attach(name, pid)
            try:
                self.shaped[uid] = shape(name, job.spec.network.access_link, self.has_netem,
                                         job.spec.scheduling)
            except BaseException:
                detach(name)
                raise
        except Exception:
            metrics.shaping_failures.inc()
            raise
        metrics.pods_shaped_total.inc()
        metrics.pods_shaped.set(len(self.shaped))
        log.info(f"{where}: {self.shaped[uid].description}")

    def _job(self, pod: Any) -> TrainingJob:
        cm_name = (pod.metadata.annotations or {}).get(resources.ANNOTATION_SPEC_MAP)
        cm = self.core.read_namespaced_config_map(cm_name, pod.metadata.namespace)
        return spec.from_dict(yaml.safe_load(cm.data[resources.SPEC_KEY]),
                              source=f"configmap {pod.metadata.namespace}/{cm_name}")

    def release_all(self) -> None:
        """Undo the shaping and enforcement of every pod (the agent is stopping)."""
        while self.shaped:
            uid, done = self.shaped.popitem()
            try:
                unshape(done)
            except TailcutError as err:
                log.error(f"{done.name}: {err}")

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
        for uid in [u for u in self.shaped if u not in present]:
            unshape(self.shaped.pop(uid))   # went away while the watch was down
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
    agent = Agent(kubernetes.client.CoreV1Api(), node,
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
                    except TailcutError as err:
                        log.error(f"{pod.metadata.namespace}/{pod.metadata.name}: {err}")
            except kubernetes.client.ApiException as err:
                log.warning(f"watch ended: {err.status} {err.reason}; reconnecting")
                time.sleep(2)
    except KeyboardInterrupt:
        pass
    finally:
        # Leave no classifier, dropper or qdisc of ours in pods the next agent may
        # never see (the chart uninstalled); one that comes back re-applies them.
        agent.release_all()
    return 0


def _stop(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
