"""What a job may ask of a node's kernel: queue memory, racks per node, links.

A job's link queues live in the rack and spine namespaces the node agent builds, where
no pod's memory cgroup is charged for the packets they hold: a job asking for deep
buffers (bufferBytes up to 1 GB per link end and HTB class) could fill a shared node's
memory until the OOM killer picks other tenants' pods. So the operator refuses, before
it creates anything, a job past any of these limits, naming the field and the limit:

    link_queue_bytes   one link end, all its classes        (default 64 MiB)
    job_queue_bytes    every link end of the job, all nodes (default 512 MiB)
    racks_per_node     racks the placement puts on one node (default 16)
    links_per_job      access links and uplinks             (default 256)

The chart sets the cluster's defaults (operator.limits: linkQueueBytes, ...); a cluster admin raises or
lowers them for one namespace with its annotations, e.g.
`tailcut.dev/max-job-queue-bytes: "2147483648"` (a tenant with `edit` in a namespace
cannot annotate the namespace itself).

A queue's memory is estimated as what its limit lets it hold: bufferBytes, or
bufferPackets (the kernel's 1000 when unset) full-size frames, each with the kernel's
per-packet overhead (SKB_OVERHEAD_BYTES). A pod's own end keeps the kernel's queue (no
switch buffer, shaping.host_end); with cadentflow every end has one queue per priority
level. Worked example, the defaults with cadentflow's 4 levels, MTU 1500: an end of
1000 packets x (1514 + 512) bytes x 4 classes = 8.1 MB; a job of 5 pods on one rack has
5 x 2 access ends + 2 uplink ends = 12 ends, 97 MB.
"""

import math
import re
from dataclasses import dataclass, fields, replace
from typing import Mapping, Optional

from tailcut.k8s.manifests import placement
from tailcut.net import topology
from tailcut.spec.model import TrainingJob

SKB_OVERHEAD_BYTES = 512    # sk_buff and skb_shared_info beside a queued frame's data
KERNEL_QUEUE_PACKETS = 1000  # txqueuelen: the queue of an end with no buffer set
ETHERNET_HEADER_BYTES = 14
ANNOTATION_PREFIX = "tailcut.dev/max-"


@dataclass(frozen=True)
class Limits:
    """What one job may ask of the nodes' kernels (see the module's docstring)."""

    link_queue_bytes: int = 64 * 2 ** 20
    job_queue_bytes: int = 512 * 2 ** 20
    racks_per_node: int = 16
    links_per_job: int = 256

    def annotation(self, name: str) -> str:
        """The namespace annotation that sets limit `name`: tailcut.dev/max-job-queue-bytes."""
        return ANNOTATION_PREFIX + name.replace("_", "-")

    def overridden(self, settings: Mapping[str, object], where: str) -> "Limits":
        """These limits with those `settings` names (the chart's camelCase name,
        linkQueueBytes, or the annotation) sets; ValueError naming `where` and the key
        for one that is no count."""
        changed: dict[str, int] = {}
        for f in fields(self):
            camel = re.sub(r"_(\w)", lambda m: m.group(1).upper(), f.name)
            for key in (camel, self.annotation(f.name)):
                if key not in settings:
                    continue
                raw = settings[key]
                try:
                    value = int(str(raw))
                except ValueError:
                    value = -1
                if value < 1:
                    raise ValueError(f"{where} {key}={raw!r}: must be a whole number >= 1")
                changed[f.name] = value
        return replace(self, **changed)


@dataclass(frozen=True)
class Ask:
    """What a job asks of the kernels, as the limits count it."""

    access_end_bytes: int   # a pod's access link at its rack's port, all classes
    uplink_end_bytes: int   # one end of an uplink, all classes
    job_queue_bytes: int    # every end of every link of the job
    links: int
    racks_per_node: int


def classes(job: TrainingJob) -> int:
    """HTB classes, each with its own queue, on every link end of the job."""
    scheduling = job.spec.scheduling
    if scheduling is not None and scheduling.policy == "cadentflow":
        return scheduling.priority_levels
    return 1


def end_queue_bytes(buffer_bytes: Optional[int], buffer_packets: Optional[int],
                    mtu: int) -> int:
    """The most memory one queue of a link end holds (one class)."""
    frame = mtu + ETHERNET_HEADER_BYTES
    if buffer_bytes is not None:   # as many frames as fit, each with its overhead
        return buffer_bytes + math.ceil(buffer_bytes / frame) * SKB_OVERHEAD_BYTES
    return (buffer_packets or KERNEL_QUEUE_PACKETS) * (frame + SKB_OVERHEAD_BYTES)


def ask(job: TrainingJob, racks_per_node: int) -> Ask:
    """What `job` asks, its racks `racks_per_node` to a node."""
    topo = topology.plan(job)
    mtu, per_class = topo.mtu, classes(job)
    access = topo.access_link
    uplink = topo.uplink
    kernel_end = end_queue_bytes(None, None, mtu) * per_class   # a pod's own end
    access_end = end_queue_bytes(access.buffer_bytes, access.buffer_packets, mtu) * per_class
    uplink_end = end_queue_bytes(uplink.buffer_bytes, uplink.buffer_packets, mtu) * per_class
    pods, racks = len(topo.pods), len(placement.occupied_racks(job))   # (no empty one is built)
    return Ask(access_end_bytes=access_end, uplink_end_bytes=uplink_end,
               job_queue_bytes=pods * (kernel_end + access_end) + racks * 2 * uplink_end,
               links=pods + racks, racks_per_node=racks_per_node)


def refusal(job: TrainingJob, racks_per_node: int, limits: Limits) -> Optional[str]:
    """Why `job` may not run here, naming the field and the limit; None: it may."""
    asked = ask(job, racks_per_node)
    raise_it = ("; a cluster admin sets this namespace's limit with the annotation "
                "{annotation} (docs/kubernetes.md, limits)")
    classes_note = (f" ({classes(job)} cadentflow classes, each with its queue)"
                    if classes(job) > 1 else "")
    network = job.spec.network
    for name, link, end_bytes in (
            ("accessLink", network.access_link, asked.access_end_bytes),
            ("uplink", network.uplink, asked.uplink_end_bytes)):
        if end_bytes > limits.link_queue_bytes:
            field = (f"spec.network.{name}.bufferBytes" if link.buffer_bytes is not None
                     else f"spec.network.{name}.bufferPackets" if link.buffer_packets
                     else "spec.scheduling.priorityLevels")
            return (f"{field}: a link end's queues may hold "
                    f"{end_bytes} bytes of kernel memory{classes_note}, above the limit "
                    f"of {limits.link_queue_bytes} per link end: give a smaller buffer"
                    + raise_it.format(annotation=limits.annotation("link_queue_bytes")))
    if asked.job_queue_bytes > limits.job_queue_bytes:
        return (f"spec.network: the job's link queues may hold {asked.job_queue_bytes} "
                f"bytes of kernel memory ({asked.links} links, both ends){classes_note}, "
                f"above the limit of {limits.job_queue_bytes} per job: give the links "
                "smaller buffers, or the job fewer pods"
                + raise_it.format(annotation=limits.annotation("job_queue_bytes")))
    if asked.links > limits.links_per_job:
        return (f"spec.replicas: the job has {asked.links} links (one per pod, one per "
                f"rack), above the limit of {limits.links_per_job} per job"
                + raise_it.format(annotation=limits.annotation("links_per_job")))
    if asked.racks_per_node > limits.racks_per_node:
        return (f"spec.network.racks: {asked.racks_per_node} racks would be built on one "
                f"node, above the limit of {limits.racks_per_node} per node: give the job "
                "fewer racks" + raise_it.format(annotation=limits.annotation("racks_per_node")))
    return None


def racks_per_node(racks: int, placed: Mapping[str, str]) -> int:
    """The most racks one node builds: by the placement (rack -> node name), or every
    rack on every node without one."""
    if not placed:
        return racks
    counts: dict[str, int] = {}
    for node in placed.values():
        counts[node] = counts.get(node, 0) + 1
    return max(counts.values())
