"""Enforce a job's scheduling policy on the testbed: priority classes on every pod.

For `cadentflow`, every shaped egress gets the HTB priority classes of
tailcut.net.shaping.plan_priorities (siblings of the default class under the link
class, each with its own copy of the link's buffer as its queue) and the DSCP classifier of tailcut.datapath.classifier at clsact egress pref 2:
each pod's eth0 (pod -> rack), the rack's port towards each pod (rack -> pod: where
several senders meet on the way to one receiver), and both ends of every uplink. The
DSCP survives bridging and routing, so one tag is honoured at every hop.
Senders then tag their sockets with classifier.tos_of(level). For `fair` nothing is
added: every flow lands in the default class and TCP shares the link. For `coflow`
nothing is added either: the senders pace each flow to its MADD rate with
SO_MAX_PACING_RATE (tailcut.scheduling.madd and .pacing; the rates go to the roles in
their `flows` config), so the network needs no class per flow.

    handle = enforce.apply(topology, job.spec.scheduling)
    handle = enforce.apply_to([(netns, "eth0", link)], scheduling)  # chosen egresses
    ...
    handle.counts()   # per pod: {level: (packets, bytes)}
    handle.detach()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from tailcut.errors import SpecError, detach_all
from tailcut.net import naming, netns, shaping, tc
from tailcut.net.topology import Pod, Rack, Topology
from tailcut.spec.model import DEFAULT_MTU, Link, Scheduling

POD_IFNAME = "eth0"


@dataclass
class Enforcement:
    """What apply() attached; detach() removes the classifiers (classes go with the
    namespaces)."""

    policy: str
    applied: dict[str, str] = field(default_factory=dict)   # "ns/ifname" -> description
    classifiers: list[object] = field(default_factory=list)

    def counts(self) -> dict[str, dict[Optional[int], tuple[int, int]]]:
        """Per "ns/ifname": packets and bytes per priority level (None = untagged)."""
        return {f"{c.netns}/{c.ifname}": c.counts()  # type: ignore[attr-defined]
                for c in self.classifiers}

    def detach(self) -> None:
        """Detach every classifier, even if one fails; the first error is raised."""
        detach_all(self.classifiers)


def weights_of(scheduling: Scheduling) -> Optional[list[float]]:
    """Per-level weights from the hand-written tags (level -> weight), or None."""
    by_level = {t.priority: t.weight for t in scheduling.flows
                if t.weight is not None and t.priority is not None}
    if not by_level:
        return None
    return [float(by_level.get(level, 1.0)) for level in range(scheduling.priority_levels)]


Egress = tuple[str, str, Link]   # (netns, ifname, the link it sends on)


def access_egresses(topo: Topology, pod: Pod, pod_ns: str,
                    ifname: str = POD_IFNAME) -> list[Egress]:
    """Both ends of `pod`'s access link: its own interface (no switch buffer there,
    shaping.host_end), and its rack's port."""
    rack = topo.racks[pod.rack]
    return [(pod_ns, ifname, shaping.host_end(topo.access_link)),
            (rack.netns, naming.rack_port(pod.slot), topo.access_link)]


def uplink_egresses(topo: Topology, rack: Rack) -> list[Egress]:
    """Both ends of `rack`'s uplink: the rack's, and the spine's."""
    return [(rack.netns, naming.RACK_UPLINK_IF, topo.uplink),
            (topo.spine_netns, naming.spine_port(rack.index), topo.uplink)]


def apply(topo: Topology, scheduling: Scheduling) -> Enforcement:
    """Add what `scheduling.policy` needs to every pod of a built topology."""
    egresses = [e for rack in topo.racks for e in (
        [a for pod in rack.pods for a in access_egresses(topo, pod, pod.netns)]
        + uplink_egresses(topo, rack))]
    return apply_to(egresses, scheduling, topo.mtu)


def apply_to(egresses: list[Egress], scheduling: Scheduling,
             mtu: int = DEFAULT_MTU) -> Enforcement:
    """Add what `scheduling.policy` needs to each egress (netns, ifname, link) whose
    HTB tree tailcut.net.tc.apply built: the local runtime's every
    shaped egress, the node agent's per pod and per node. All or nothing: if one fails, the
    classifiers already attached are detached."""
    result = Enforcement(scheduling.policy)
    if scheduling.policy in ("fair", "coflow"):  # coflow: the senders pace, see above
        return result
    if scheduling.policy != "cadentflow":
        raise SpecError(f"spec.scheduling.policy={scheduling.policy!r}: the testbed enforces "
                        "fair, coflow and cadentflow")
    from tailcut.datapath import classifier  # BCC loads only when a job asks for it

    weights = weights_of(scheduling)
    try:
        for ns, ifname, link in egresses:
            classes = shaping.plan_priorities(link.bandwidth, scheduling.priority_levels,
                                              weights, shaping.buffer(link), mtu)
            with netns.ipr(ns) as ipr:
                tc.apply_priorities(classes, ipr, ifname)
            result.classifiers.append(classifier.attach(ns, ifname))
            result.applied[f"{ns}/{ifname}"] = shaping.describe_priorities(classes)
    except BaseException:
        result.detach()
        raise
    return result
