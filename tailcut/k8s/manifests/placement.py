"""Which node holds each rack of a job, on a cluster of several nodes.

A rack's pods hang off its ToR bridge by veths (tailcut.k8s.agent), so a rack lives on
one node: the operator places the job's racks round robin on the schedulable nodes
(sorted by name, starting at one chosen by a hash of the job, so that jobs do not all
put their first rack on the same node), pins the rack's pods there with a nodeSelector,
and records the placement with each node's InternalIP in the TrainingJob's
status.placement before it creates anything (the status subresource: only the operator
writes it). The node agents read it there: each builds the racks placed on its node and
the job's spine, and joins its spine to the other nodes' spines of the job by VXLAN to
those addresses and accepts the VXLAN only from them (tailcut.net.overlay).

Pure functions of the API's node objects (as dicts, camelCase), so they are tested
without a cluster. No schedulable node (an API server without kubelets): no placement,
and the pods keep the preferred rack affinity of tailcut.k8s.manifests.resources.
"""

import hashlib
import ipaddress
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from tailcut.spec.model import TrainingJob

HOSTNAME_LABEL = "kubernetes.io/hostname"
_BLOCKING_TAINTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class NodeAddress:
    name: str
    hostname: str   # its kubernetes.io/hostname label, what the nodeSelector matches
    ip: str         # its InternalIP: the VXLAN endpoint of its spine


Placement = dict[str, NodeAddress]   # rack name -> node


def schedulable(nodes: list[Mapping[str, Any]]) -> list[NodeAddress]:
    """The Ready nodes a pod may be scheduled to (not cordoned, no NoSchedule or
    NoExecute taint) that have an InternalIP, sorted by name."""
    found = []
    for node in nodes:
        meta, spec, status = (node.get(k) or {} for k in ("metadata", "spec", "status"))
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or [])
        blocked = spec.get("unschedulable") or any(
            t.get("effect") in _BLOCKING_TAINTS for t in spec.get("taints") or [])
        ips = [a["address"] for a in status.get("addresses") or []
               if a.get("type") == "InternalIP"]
        if ready and not blocked and ips:
            name = meta["name"]
            found.append(NodeAddress(name=name, ip=ips[0], hostname=(
                meta.get("labels") or {}).get(HOSTNAME_LABEL, name)))
    return sorted(found, key=lambda n: n.name)


def place(job: TrainingJob, namespace: str, nodes: list[NodeAddress]) -> Placement:
    """The i-th rack that holds pods on node (start + i) mod len(nodes), start from a
    hash of the job's namespace and name; empty without nodes. A rack with no pod is
    placed nowhere: no node builds it (its queues would hold kernel memory for nothing)."""
    if not nodes:
        return {}
    start = int(hashlib.sha256(f"{namespace}/{job.name}".encode()).hexdigest(), 16)
    return {rack: nodes[(start + i) % len(nodes)]
            for i, rack in enumerate(occupied_racks(job))}


def occupied_racks(job: TrainingJob) -> list[str]:
    """The job's racks that hold at least one pod, in the spec's order."""
    held = set(job.spec.rack_of().values())
    return [rack.name for rack in job.spec.network.racks if rack.name in held]


def to_status(placement: Placement) -> dict[str, dict[str, str]]:
    """The TrainingJob's status.placement (tailcut.k8s.manifests.status.RackNode per rack)."""
    return {rack: {"node": n.name, "hostname": n.hostname, "ip": n.ip}
            for rack, n in placement.items()}


def from_status(recorded: Mapping[str, Any]) -> Placement:
    """The placement in a TrainingJob's status.placement; empty if it has none.
    ValueError naming the field if a rack's record is not what the operator writes:
    its ip goes into the VXLAN and the nftables guard (tailcut.net.overlay), so it
    must be an IPv4 address and nothing more."""
    found = {}
    for rack, n in (recorded or {}).items():
        at = f"status.placement.{rack}"
        if not isinstance(n, Mapping) or not all(
                isinstance(n.get(k), str) and n.get(k) for k in ("node", "hostname", "ip")):
            raise ValueError(f"{at}={n!r}: needs node, hostname and ip, each a string")
        try:
            ip = ipaddress.IPv4Address(n["ip"])
        except ValueError as err:
            raise ValueError(f"{at}.ip={n['ip']!r}: not an IPv4 address (the node's "
                             "InternalIP)") from err
        if ip.is_unspecified or ip.is_multicast or ip.is_loopback:
            raise ValueError(f"{at}.ip={n['ip']!r}: not a node's address")
        found[rack] = NodeAddress(name=n["node"], hostname=n["hostname"], ip=str(ip))
    return found


def scheduling(rack: str, placement: Placement) -> Optional[dict[str, Any]]:
    """The pod spec fields that pin a pod of `rack` to its node, or None."""
    node = placement.get(rack)
    if node is None:
        return None
    return {"nodeSelector": {HOSTNAME_LABEL: node.hostname}}
