"""Varys' MADD on the testbed: the rate of every flow of a coflow, from sizes and links.

Minimum Allocation for Desired Duration (Chowdhury et al., SIGCOMM'14): a coflow's
duration can be no shorter than its bottleneck time

    Gamma = max over the links l it uses of (bytes of its flows crossing l) / capacity(l)

and every flow finishes exactly then if it runs at ``bytes / Gamma``. No link is then
over its capacity (each link's load / Gamma <= capacity by Gamma's definition), so
the rates can be enforced by pacing each flow's sender (tailcut.scheduling.pacing)
without any queue in the network deciding anything.

Links are named as the testbed builds them (tailcut.net.topology): every pod has an
``<pod>/up`` (its eth0, pod -> rack) and a ``<pod>/down`` (the rack's port towards
it); a flow between racks also crosses ``rack:<rack>/up`` and ``rack:<rack>/down`` (the
rack's uplink to the spine, and the other rack's from it). Capacities are the spec's link
bandwidths times the TCP goodput of a full frame (1448 payload bytes per 1514 on the
wire: the pacing rate counts payload, HTB counts frames) times a headroom below 1
that leaves the shaper a little slack (see ``HEADROOM``).

    flows = [madd.Flow(("ps-0", "worker-0"), madd.path(topo, "ps-0", "worker-0"), 4e6), ...]
    rates = madd.rates(flows, madd.capacities(topo))   # bytes/s per flow key
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from tailcut.net.topology import Topology

GOODPUT = 1448 / 1514
# Pace the coflow at 95% of the links' goodput: the sum of paced rates then stays
# just under what HTB lets through, so no queue builds in the shaper (a queue there
# would be drained first come first served and undo the proportions).
HEADROOM = 0.95


@dataclass(frozen=True)
class Flow:
    """One flow of a coflow: a key (e.g. (sender, receiver)), the links it crosses,
    and its bytes."""

    key: Hashable
    links: tuple[str, ...]
    bytes: float


def path(topo: Topology, src: str, dst: str) -> tuple[str, ...]:
    """The shaped links a flow from pod ``src`` to pod ``dst`` crosses, in order."""
    a, b = topo.pod(src), topo.pod(dst)
    if a.rack == b.rack:
        return (f"{src}/up", f"{dst}/down")
    return (f"{src}/up", f"rack:{topo.racks[a.rack].name}/up",
            f"rack:{topo.racks[b.rack].name}/down", f"{dst}/down")


def capacities(topo: Topology, headroom: float = HEADROOM) -> dict[str, float]:
    """Payload bytes/s each shaped link of ``topo`` can carry under pacing."""
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom={headroom}: must be in (0, 1]")
    access = topo.access_link.bandwidth / 8 * GOODPUT * headroom
    uplink = topo.uplink.bandwidth / 8 * GOODPUT * headroom
    caps = {}
    for pod in topo.pods:
        caps[f"{pod.name}/up"] = caps[f"{pod.name}/down"] = access
    for rack in topo.racks:
        caps[f"rack:{rack.name}/up"] = caps[f"rack:{rack.name}/down"] = uplink
    return caps


def load(flows: Sequence[Flow]) -> dict[str, float]:
    """Bytes of the coflow crossing each link."""
    per_link: dict[str, float] = defaultdict(float)
    for flow in flows:
        for link in flow.links:
            per_link[link] += flow.bytes
    return dict(per_link)


def gamma_s(flows: Sequence[Flow], capacity: Mapping[str, float]) -> float:
    """The coflow's bottleneck time: max over its links of load / capacity (s)."""
    for flow in flows:
        if flow.bytes < 0:
            raise ValueError(f"flow {flow.key!r}: bytes={flow.bytes} must be >= 0")
        for link in flow.links:
            if link not in capacity:
                raise ValueError(f"flow {flow.key!r} crosses link {link!r}, which has no "
                                 f"capacity; links: {', '.join(sorted(capacity))}")
            if capacity[link] <= 0:
                raise ValueError(f"link {link!r}: capacity {capacity[link]} must be > 0")
    return max((b / capacity[link] for link, b in load(flows).items()), default=0.0)


def rates(flows: Sequence[Flow], capacity: Mapping[str, float]) -> dict[Hashable, float]:
    """MADD: every flow's rate (bytes/s) is its bytes / Gamma, so all finish at Gamma.
    A flow of 0 bytes gets rate 0 (nothing to pace)."""
    keys = [f.key for f in flows]
    if len(set(keys)) != len(keys):
        raise ValueError("flow keys must be unique within a coflow")
    gamma = gamma_s(flows, capacity)
    if gamma == 0:
        return {f.key: 0.0 for f in flows}
    return {f.key: f.bytes / gamma for f in flows}


def allocate(coflows: Mapping[Hashable, Sequence[Flow]], capacity: Mapping[str, float],
             floor: float = 0.0) -> dict[Hashable, float]:
    """Rates of the flows of several coflows at once, as Varys orders them: smallest
    bottleneck first (SEBF), each coflow getting MADD on what the ones before it left.
    A coflow that finds one of its links full waits: its flows get ``floor`` (a
    paced socket cannot be stopped, so the caller picks a small positive rate).
    Flow keys must be unique across coflows."""
    residual = dict(capacity)
    order = sorted(coflows, key=lambda c: (gamma_s(coflows[c], capacity), repr(c)))
    out: dict[Hashable, float] = {}
    for cid in order:
        flows = [f for f in coflows[cid] if f.bytes > 0]
        for f in coflows[cid]:
            if f.key in out:
                raise ValueError(f"flow key {f.key!r} is in more than one coflow")
            out[f.key] = floor
        if not flows:
            continue
        if any(residual[link] <= 1e-9 * capacity[link] for f in flows for link in f.links):
            continue
        got = rates(flows, residual)
        out.update(got)
        for f in flows:
            for link in f.links:
                residual[link] = max(0.0, residual[link] - got[f.key])
    return out
