"""Join a job's spines on several nodes into one, by VXLAN between the nodes.

When a job's racks sit on different nodes (tailcut.k8s.manifests.placement), each node has its
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
job's (spec.network.mtu, the pods' too), and VXLAN adds 50 bytes of outer headers: the
node LAN needs an MTU of at least the job's + 50 (1550 for the default 1500, 9050 for
jumbo frames), or the outer packets are fragmented (or, on a bridge or veth, dropped).
`too_small` finds a node link that is short of it, before anything is built.

What goes out goes only to the peers (the static entries; no default destination).
What comes in is another matter: the kernel hands a VXLAN packet to the device of its
VNI whatever its source, and the VNI is a hash of the job's name. So the overlay is
guarded in the node's namespace by an nftables table of ours, before the packets reach
the VXLAN socket (the input hook), one chain per job, e.g. for VNI 1193046 with peers
192.168.78.2 and .3:

    table ip tck8s_overlay {
      map vnis { typeof @th,96,24 : verdict; elements = { 1193046 : jump vni_1193046 } }
      chain input { type filter hook input priority filter; policy accept;
                    udp dport 4789 @th,96,24 vmap @vnis }   # th+12 bytes: the VNI
      chain vni_1193046 { ip saddr != { 192.168.78.2, 192.168.78.3 } counter drop }
    }

A source address is not a proof: a host that can forge a peer node's address on the
node network can still inject (docs/kubernetes.md says what remains).
"""

import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Optional

from tailcut.errors import NetError
from tailcut.net import forwarding, naming, netns
from tailcut.spec.model import DEFAULT_MTU

VXLAN_PORT = 4789
VXLAN_IF = "vx0"
VXLAN_OVERHEAD_BYTES = 50   # outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8
NUD_PERMANENT = 0x80
TABLE = "tck8s_overlay"   # nftables, family ip, in the node's namespace


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


def join(spine_ns: str, job: str, vni_id: int, me: Spine, peers: list[Spine],
         mtu: int = DEFAULT_MTU) -> str:
    """Add vx0, of the job's `mtu`, to `spine_ns`, route `peers`' subnets over it and
    accept its packets only from the peers' addresses (guard). Call it from the node's
    network namespace: the outer packets leave from there and the guard lives there;
    `leave` removes the guard (vx0 goes with the spine). Returns what was applied."""
    from pyroute2 import IPRoute

    guard(vni_id, peers)   # first: no moment when vx0 takes packets from anywhere
    try:
        with IPRoute() as ipr:   # here: the node's namespace
            ipr.link("add", ifname=VXLAN_IF, kind="vxlan", vxlan_id=vni_id,
                     vxlan_local=me.underlay_ip, vxlan_port=VXLAN_PORT, vxlan_learning=0,
                     net_ns_fd=netns.path(spine_ns))
    except BaseException:
        leave(vni_id)
        raise
    with netns.ipr(spine_ns) as spine:
        index = spine.link_lookup(ifname=VXLAN_IF)[0]
        spine.link("set", index=index, address=me.mac, mtu=mtu, ifalias=naming.alias(job))
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
            + ", ".join(f"{p.underlay_ip} ({', '.join(p.subnets)})" for p in peers)
            + f"; accepted only from {', '.join(p.underlay_ip for p in peers)}")


def vni_of(spine_ns: str) -> Optional[int]:
    """The VXLAN id of the vx0 in `spine_ns`, or None if it has none."""
    with netns.ipr(spine_ns) as spine:
        found = spine.link_lookup(ifname=VXLAN_IF)
        if not found:
            return None
        info = spine.get_links(found[0])[0].get_attr("IFLA_LINKINFO")
    data = info.get_attr("IFLA_INFO_DATA") if info is not None else None
    found_id = data.get_attr("IFLA_VXLAN_ID") if data is not None else None
    return int(found_id) if found_id is not None else None


@dataclass(frozen=True)
class Shortfall:
    """A peer reached through a link too small for the job's packets in VXLAN."""

    peer_ip: str
    ifname: str
    link_mtu: int

    def most(self) -> int:
        """The largest job MTU this link carries whole."""
        return self.link_mtu - VXLAN_OVERHEAD_BYTES


def too_small(peers: list[Spine], mtu: int) -> Optional[Shortfall]:
    """The first peer that this (the node's) namespace reaches through a link of MTU
    below `mtu` + 50, or None. A peer with no route is left to the VXLAN to fail on."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    with IPRoute() as ipr:
        for peer in peers:
            try:
                route = ipr.route("get", dst=peer.underlay_ip)[0]
                link = ipr.get_links(route.get_attr("RTA_OIF"))[0]
            except (NetlinkError, IndexError):
                continue
            link_mtu = int(link.get_attr("IFLA_MTU"))
            if link_mtu < mtu + VXLAN_OVERHEAD_BYTES:
                return Shortfall(peer.underlay_ip, str(link.get_attr("IFLA_IFNAME")),
                                 link_mtu)
    return None


def guard(vni_id: int, peers: list[Spine]) -> None:
    """Drop VXLAN packets of `vni_id` from any source but the peers' addresses, in
    this (the node's) network namespace. Replaces the job's chain if it is there
    (left by an agent killed outright)."""
    if not peers:
        raise NetError(f"vxlan {vni_id}: no peer to accept packets from")
    chain = f"vni_{vni_id}"
    if _nft(f"list map ip {TABLE} vnis", check=False) != 0:   # the node's first overlay
        _nft(f"add table ip {TABLE}\n"
             f"add map ip {TABLE} vnis {{ typeof @th,96,24 : verdict; }}\n"
             f"add chain ip {TABLE} input {{ type filter hook input priority filter; "
             "policy accept; }\n"
             f"add rule ip {TABLE} input udp dport {VXLAN_PORT} @th,96,24 vmap @vnis\n")
    sources = ", ".join(p.underlay_ip for p in peers)
    _nft(f"add chain ip {TABLE} {chain}\nflush chain ip {TABLE} {chain}\n"
         f"add rule ip {TABLE} {chain} ip saddr != {{ {sources} }} counter drop\n")
    if _nft(f"get element ip {TABLE} vnis {{ {vni_id} }}", check=False) != 0:
        _nft(f"add element ip {TABLE} vnis {{ {vni_id} : jump {chain} }}\n")


def leave(vni_id: int) -> int:
    """Remove the guard of `vni_id` (and the table with the node's last one); the
    packets it dropped. Nothing there is fine."""
    dropped = refused(vni_id)
    _nft(f"delete element ip {TABLE} vnis {{ {vni_id} }}\n"
         f"delete chain ip {TABLE} vni_{vni_id}\n", check=False)
    shown = _nft_json(f"list map ip {TABLE} vnis")
    if shown is not None and not any(m.get("map", {}).get("elem") for m in shown):
        _nft(f"delete table ip {TABLE}\n", check=False)
    return dropped


def refused(vni_id: int) -> int:
    """The packets of `vni_id` the guard has dropped (0 without one)."""
    shown = _nft_json(f"list chain ip {TABLE} vni_{vni_id}") or []
    return sum(e["counter"]["packets"] for item in shown
               for e in item.get("rule", {}).get("expr", []) if "counter" in e)


def _nft(script: str, check: bool = True) -> int:
    nft = shutil.which("nft")
    if nft is None:
        raise NetError("the VXLAN between a job's nodes needs nft (Debian's nftables "
                       "package) to accept it only from the job's nodes: install it")
    result = subprocess.run([nft, "-f", "-"], input=script, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise NetError(f"nft: {result.stderr.strip()} (applying: {script.strip()})")
    return result.returncode


def _nft_json(command: str) -> Optional[list[dict[str, Any]]]:
    nft = shutil.which("nft")
    if nft is None:
        return None
    result = subprocess.run([nft, "-j", *command.split()], capture_output=True, text=True)
    if result.returncode != 0:
        return None
    return list(json.loads(result.stdout).get("nftables", []))
