"""Join a job's spines on several nodes into one, by VXLAN between the nodes.

When a job's racks sit on different nodes (tailcut.k8s.placement), each node has its
own spine namespace routing between the racks it holds. This adds to each spine a
VXLAN interface, vx0, whose outer packets leave from the node's own address (the
device is created in the node's network namespace and moved into the spine, so its
UDP socket stays in the node's), and routes the other nodes' rack subnets to their
spines over it:

    node A: spine-A  r0 10.1.0.1   vx0 10.255.0.1 ==VXLAN (UDP 4789, one VNI per job)==
    node B: spine-B  r1 10.2.0.1   vx0 10.255.0.2      10.1.0.0/24 via 10.255.0.1 ...

Every address is known from the placement, so nothing is learnt: each vx0 has a MAC
of its spine's number, and the forwarding database and neighbour table get permanent
entries for the other spines (no flooding, no ARP over the overlay). vx0's MTU is the
pods' (1500), so a node LAN whose MTU is below 1550 fragments the outer packets.
"""

import hashlib
from dataclasses import dataclass

from tailcut.net import forwarding, naming, netns

VXLAN_PORT = 4789
VXLAN_IF = "vx0"
MTU = 1500
NUD_PERMANENT = 0x80


@dataclass(frozen=True)
class Spine:
    """One node's spine of a job, as the others see it."""

    index: int                  # its number among the job's nodes, from 0
    underlay_ip: str            # its node's address
    subnets: tuple[str, ...]    # the rack subnets behind it

    @property
    def ip(self) -> str:
        """Its address on the overlay (racks use 10.1-10.250; 10.255 is free)."""
        return f"10.255.0.{self.index + 1}"

    @property
    def mac(self) -> str:
        return f"02:74:63:00:00:{self.index + 1:02x}"


def vni(key: str) -> int:
    """The job's VXLAN network identifier (24 bits) from a key naming it uniquely."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:6], 16) or 1


def join(spine_ns: str, job: str, vni_id: int, me: Spine, peers: list[Spine]) -> str:
    """Add vx0 to `spine_ns` and route `peers`' subnets over it. Call it from the node's
    network namespace: the outer packets leave from there. Returns what was applied."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:   # here: the node's namespace
        ipr.link("add", ifname=VXLAN_IF, kind="vxlan", vxlan_id=vni_id,
                 vxlan_local=me.underlay_ip, vxlan_port=VXLAN_PORT, vxlan_learning=0,
                 net_ns_fd=netns.path(spine_ns))
    with netns.ipr(spine_ns) as spine:
        index = spine.link_lookup(ifname=VXLAN_IF)[0]
        spine.link("set", index=index, address=me.mac, mtu=MTU, ifalias=naming.alias(job))
        spine.addr("add", index=index, address=me.ip, prefixlen=24)
        spine.link("set", index=index, state="up")
        for peer in peers:
            spine.fdb("append", ifindex=index, lladdr=peer.mac, dst=peer.underlay_ip)
            spine.neigh("replace", dst=peer.ip, lladdr=peer.mac, ifindex=index,
                        state=NUD_PERMANENT)
            for subnet in peer.subnets:
                spine.route("add", dst=subnet, gateway=peer.ip)
    forwarding.enable(spine_ns, VXLAN_IF)
    return (f"vxlan {vni_id} from {me.underlay_ip} to "
            + ", ".join(f"{p.underlay_ip} ({', '.join(p.subnets)})" for p in peers))
