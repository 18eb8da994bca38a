"""The node agent: shapes each tailcut pod's link from inside its network namespace.

Runs on every node (a DaemonSet with hostPID and the capabilities listed in the
chart's values.yaml). It watches the tailcut pods scheduled to its node; when one is
running it finds a process of the pod by the pod's UID in /proc/<pid>/cgroup, gives
that process's network namespace a name (a bind mount under /run/netns, as `ip netns
attach` does, but only inside the agent's own mount namespace) and applies the job's
access-link shaping to the pod's eth0 with the same code the local runtime uses
(tailcut.net.shaping.plan/apply). When the pod goes, it drops the name; the kernel
frees the qdiscs and programs with the namespace.

Names: tck8s-<first 12 characters of the pod UID>. Not "tailcut-": `tailcut clean`
would otherwise end the pod's processes as leftovers of a local run.

The operator never touches netlink; this is the one privileged place.
"""

import ctypes
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import yaml

from tailcut import features, spec
from tailcut.errors import TailcutError
from tailcut.k8s import resources
from tailcut.net import netns, shaping
from tailcut.spec.model import Link

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


def shape(name: str, link: Link, has_netem: bool) -> Shaped:
    """Apply `link`'s shaping to eth0 in namespace `name`: the pod's egress. (The
    other direction is shaped where the local runtime shapes it too: on the peer end,
    which on Kubernetes belongs to the CNI, so only egress is ours.)"""
    ops = shaping.plan(link, has_netem, "spec.network.accessLink")
    with netns.ipr(name) as ipr:
        if not ipr.link_lookup(ifname=POD_IF):
            raise AgentError(f"{name}: no {POD_IF} in the pod's network namespace")
        droppers = shaping.apply(ops, ipr, name, POD_IF)
    return Shaped(name=name, description=shaping.describe(ops), droppers=droppers)


def unshape(shaped: Shaped) -> None:
    for d in shaped.droppers:
        d.detach()  # type: ignore[attr-defined]
    detach(shaped.name)


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
                unshape(done)
                log.info(f"{pod.metadata.namespace}/{pod.metadata.name}: released {done.name}")
            return
        if uid in self.shaped or not pod.status or pod.status.phase != "Running":
            return
        where = f"{pod.metadata.namespace}/{pod.metadata.name}"
        if pod.spec.host_network and not self.shape_host_network:
            log.warning(f"{where}: on the host network; not shaped (shaping it would shape "
                        "the node; set agent.dangerouslyShapeHostNetworkPods to allow)")
            return
        link = self._access_link(pod)
        pid = pid_of_pod(uid)
        if pid is None:
            log.warning(f"{where}: running but no process found in /proc; retrying later")
            return
        name = netns_name(uid)
        attach(name, pid)
        try:
            self.shaped[uid] = shape(name, link, self.has_netem)
        except BaseException:
            detach(name)
            raise
        log.info(f"{where}: {self.shaped[uid].description}")

    def _access_link(self, pod: Any) -> Link:
        cm_name = (pod.metadata.annotations or {}).get(resources.ANNOTATION_SPEC_MAP)
        cm = self.core.read_namespaced_config_map(cm_name, pod.metadata.namespace)
        job = spec.from_dict(yaml.safe_load(cm.data[resources.SPEC_KEY]),
                             source=f"configmap {pod.metadata.namespace}/{cm_name}")
        return job.spec.network.access_link

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
                                  allow_watch_bookmarks=True, timeout_seconds=300,
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
    while True:
        try:
            for event_type, pod in agent.events():
                try:
                    agent.handle(event_type, pod)
                except TailcutError as err:
                    log.error(f"{pod.metadata.namespace}/{pod.metadata.name}: {err}")
        except kubernetes.client.ApiException as err:
            log.warning(f"watch ended: {err.status} {err.reason}; reconnecting")
            time.sleep(2)


if __name__ == "__main__":
    sys.exit(main())
