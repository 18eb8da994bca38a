"""Build a planned Topology in the kernel, and tear it down again.

Rack r's ToR is a bridge in its own namespace; the spine is one namespace routing
between the rack subnets. Pods hang off their ToR by a veth (the access link), racks
off the spine by a veth (the uplink); each end of each veth shapes its own egress, so
both directions of a link are shaped:

    pod ns            rack ns                         spine ns
    eth0 ==access== p<slot> -[tor bridge]- up ==uplink== r<rack> (gateway, routes)

The local runtime builds it all at once (`build`). The Kubernetes node agent builds
the same thing in two steps with the same functions: the spine and racks of a job
(`build_fabric`) when its first pod reaches the node, then each pod as it starts
(`wire_pod`), into the pod's own network namespace through a second interface
(`KUBERNETES`: tc0, leaving the CNI's eth0 and default route alone).

Random loss needs the eBPF dropper, tailcut.datapath.dropper, which sits above this
layer: `build` and `build_fabric` take it from their caller (`droppers`) and refuse a
lossy link without it, before anything is built.
"""

import os
import socket
import time
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from pyroute2 import IPRoute

from tailcut.errors import AlreadyExists, NetError, detach_all
from tailcut.net import clean, forwarding, naming, netns, rtnl, shaping, tc
from tailcut.net.topology import Pod, Rack, Topology

UP_TIMEOUT_S = 5.0
BR_FORWARDING = 3  # IFLA_BRPORT_STATE value of a forwarding bridge port
NUD_PERMANENT = rtnl.NUD_PERMANENT  # a neighbour entry that never expires or gets probed


@dataclass(frozen=True)
class PodWiring:
    """How a pod hangs off its ToR."""

    ifname: str = naming.POD_IF   # the pod's end of its access link
    # Route everything through the ToR (a local pod has no other way out), or only
    # the job's rack subnets (a Kubernetes pod keeps the CNI's default route for DNS
    # and the API server).
    default_route: bool = True


LOCAL = PodWiring()
KUBERNETES = PodWiring(ifname=naming.DATA_IF, default_route=False)


class Sockets(dict[str, IPRoute]):
    """One netlink socket per namespace, opened on first use: pyroute2's, and a raw
    one for batches (rtnl)."""

    def __init__(self) -> None:
        super().__init__()
        self.raw: dict[str, socket.socket] = {}

    def __missing__(self, ns: str) -> IPRoute:
        self[ns] = netns.ipr(ns)
        return self[ns]

    def rtnl(self, ns: str) -> socket.socket:
        if ns not in self.raw:
            self.raw[ns] = rtnl.socket_in(ns)
        return self.raw[ns]

    def close(self) -> None:
        for sock in self.values():
            sock.close()
        for raw in self.raw.values():
            raw.close()
        self.clear()
        self.raw.clear()


@dataclass
class Network:
    """A built topology (or the part of it on one node): what was applied where, and
    the handles to undo it."""

    topology: Topology
    wiring: PodWiring = LOCAL
    access_ops: list[shaping.Op] = field(default_factory=list)   # the rack's port
    uplink_ops: list[shaping.Op] = field(default_factory=list)
    pod_end_ops: list[shaping.Op] = field(default_factory=list)  # the pod's own end
    wire_end_ops: list[shaping.Op] = field(default_factory=list)  # the port's ingress
    applied: dict[str, str] = field(default_factory=dict)   # "ns/ifname" -> description
    rate_bit: dict[str, int] = field(default_factory=dict)  # "ns/ifname" -> its HTB rate
    bridges: dict[str, str] = field(default_factory=dict)   # "ns/bridge" -> description
    droppers: list[object] = field(default_factory=list)    # on the fabric's links
    pods: dict[str, str] = field(default_factory=dict)      # wired pod -> its namespace
    pod_droppers: dict[str, list[object]] = field(default_factory=dict)
    racks: list[int] = field(default_factory=list)          # built here (build_fabric)
    # ifindexes, for requests by index without a lookup: each wired pod's end of its
    # access link, and each rack's gateway port on the spine
    pod_ifindex: dict[str, int] = field(default_factory=dict)
    spine_ifindex: dict[int, int] = field(default_factory=dict)
    tor_ifindex: dict[int, int] = field(default_factory=dict)
    # what attaches the droppers of Drop ops (tailcut.datapath.dropper), from build's caller
    attacher: Optional[tc.Droppers] = None

    def destroy(self) -> None:
        """Release the eBPF droppers (our hold on their programs; their filters go with
        the links) and remove every namespace of the job."""
        try:
            self._detach_all(how="release")
        finally:
            teardown(self.topology.job)

    def _detach_all(self, how: str = "detach") -> None:
        everything = self.droppers + [d for ds in self.pod_droppers.values() for d in ds]
        self.droppers, self.pod_droppers = [], {}
        detach_all(everything, how)

    def dropper_counts(self) -> tuple[int, int]:
        """(passed, dropped) packets summed over every eBPF dropper of the run."""
        passed = dropped = 0
        for d in self.droppers + [d for ds in self.pod_droppers.values() for d in ds]:
            p, q = d.counts()  # type: ignore[attr-defined]
            passed, dropped = passed + p, dropped + q
        return passed, dropped

    def queue_drops(self, ends: Optional[Iterable[str]] = None) -> dict[str, int]:
        """Per shaped link end ("ns/ifname"; all of them, or those of `ends`): the
        packets its queues dropped so far because they were full
        (tailcut.net.tc.queue_drops), apart from the eBPF droppers' random loss.
        Read it before teardown: the counters go with the links."""
        by_ns: dict[str, list[str]] = {}
        for end in self.applied if ends is None else ends:
            ns, _, ifname = end.rpartition("/")
            by_ns.setdefault(ns, []).append(ifname)
        out = {}
        for ns, ifnames in by_ns.items():
            if not netns.exists(ns):
                continue
            with netns.ipr(ns) as ipr:
                for ifname in ifnames:
                    drops = tc.queue_drops(ipr, ifname)
                    if drops is not None:
                        out[f"{ns}/{ifname}"] = drops
        return out

    def access_link_summary(self, pod: Pod) -> str:
        """How `pod`'s access link is shaped, its own end and its switch port's, in words."""
        rack = self.topology.racks[pod.rack]
        own = self.pods.get(pod.name, pod.netns)
        return (f"pod end {self.applied[f'{own}/{self.wiring.ifname}']}; switch port "
                f"{self.applied[f'{rack.netns}/{naming.rack_port(pod.slot)}']}")

    def pod_link_bytes(self) -> dict[str, dict[str, int]]:
        """Per wired pod, what its end of the access link sent and received so far
        (the kernel's counters of its interface): the bytes on each pod's link. What
        the pod sent counts the packets its direction's random loss drops later, at
        the switch port (shaping.wire_end)."""
        out = {}
        for pod, ns in self.pods.items():
            with netns.ipr(ns) as ipr:
                found = ipr.link_lookup(ifname=self.wiring.ifname)
                if not found:
                    continue
                stats = ipr.get_links(found[0])[0].get_attr("IFLA_STATS64")
            out[pod] = {k: int(stats[k]) for k in ("rx_bytes", "tx_bytes", "rx_packets",
                                                   "tx_packets")}
        return out


def _network(topo: Topology, has_netem: bool, wiring: PodWiring,
             droppers: Optional[tc.Droppers]) -> Network:
    """An empty Network with the shaping of the access link (at the rack's port, and at
    the pod's own end, which has no switch buffer) and of the uplink; raises for a link
    the kernel cannot emulate, or a lossy one without `droppers`, before anything
    exists."""
    field, mtu = "spec.network.accessLink", topo.mtu
    network = Network(
        topology=topo, wiring=wiring, attacher=droppers,
        access_ops=shaping.plan(topo.access_link, has_netem, field, mtu),
        pod_end_ops=shaping.plan(shaping.host_end(topo.access_link), has_netem, field, mtu),
        wire_end_ops=shaping.wire_end(topo.access_link),
        uplink_ops=shaping.plan(topo.uplink, has_netem, "spec.network.uplink", mtu))
    if droppers is None:
        for name, ops in (("spec.network.accessLink", network.access_ops
                           + network.pod_end_ops + network.wire_end_ops),
                          ("spec.network.uplink", network.uplink_ops)):
            if any(isinstance(op, shaping.Drop) for op in ops):
                raise NetError(f"{name}: its loss needs the eBPF dropper and the network "
                               "builder was given none (droppers=tailcut.datapath.dropper)")
    return network


def build(topo: Topology, has_netem: bool,
          droppers: Optional[tc.Droppers] = None) -> Network:
    """Create every namespace, bridge, veth, address, route and qdisc of `topo`, and
    the eBPF droppers of its random loss with `droppers` (tailcut.datapath.dropper;
    needed only if a link loses packets). On any failure, whatever was created is
    removed before the error propagates."""
    network = _network(topo, has_netem, LOCAL, droppers)
    taken = [n for n in topo.namespaces() if netns.exists(n)]
    if taken:
        raise AlreadyExists(f"job {topo.job!r} already has namespaces on this host "
                            f"({', '.join(taken[:3])}...): a run is still going or one was "
                            f"killed; `tailcut clean {topo.job}` removes its leftovers")
    sockets = Sockets()
    try:
        for pod in topo.pods:
            netns.create(pod.netns)
        _build_fabric(network, topo.racks, sockets)
        for pod in topo.pods:
            _wire_pod(network, pod, pod.netns, sockets, pin=False)
        _pin_neighbours(network, list(topo.pods))
        _wait_until_up(topo.namespaces())
        return network
    except BaseException:
        network.destroy()
        raise
    finally:
        sockets.close()


def build_fabric(topo: Topology, racks: Iterable[Rack], has_netem: bool,
                 wiring: PodWiring = KUBERNETES,
                 droppers: Optional[tc.Droppers] = None) -> Network:
    """The spine and `racks` of `topo` with their uplinks, shaped both ways, and no
    pod yet: wire_pod adds them one by one (with the same `droppers`, as `build`'s).
    All or nothing."""
    network = _network(topo, has_netem, wiring, droppers)
    sockets = Sockets()
    try:
        _build_fabric(network, tuple(racks), sockets)
        return network
    except BaseException:
        remove_fabric(network)
        raise
    finally:
        sockets.close()


def adopt_fabric(topo: Topology, racks: Iterable[Rack], has_netem: bool,
                 wiring: PodWiring = KUBERNETES,
                 droppers: Optional[tc.Droppers] = None) -> Optional[Network]:
    """The record of a fabric that build_fabric built earlier (in another process,
    the node agent before it restarted): what its uplinks got, with no handle on its
    eBPF droppers (they stay attached and keep dropping; their counts are the old
    process's). Nothing is changed. None if any namespace or uplink is missing."""
    network = _network(topo, has_netem, wiring, droppers)
    racks = tuple(racks)
    for rack in racks:
        ends = ((rack.netns, naming.RACK_UPLINK_IF),
                (topo.spine_netns, naming.spine_port(rack.index)))
        if not all(_link_exists(ns, ifname) for ns, ifname in ends):
            return None
        network.racks.append(rack.index)
        for ns, ifname in ends:
            network.applied[f"{ns}/{ifname}"] = shaping.describe(network.uplink_ops)
            network.rate_bit[f"{ns}/{ifname}"] = shaping.rate_bit(network.uplink_ops)
    return network


def adopt_pod(network: Network, pod: Pod, pod_ns: str) -> Optional[dict[str, str]]:
    """Take `pod`'s access link, wired by an earlier process into an adopted fabric,
    into `network`'s record; returns what its two ends got (as wire_pod does), or None
    if either end is missing (then wire it anew)."""
    rack = network.topology.racks[pod.rack]
    port = naming.rack_port(pod.slot)
    if not (_link_exists(pod_ns, network.wiring.ifname) and _link_exists(rack.netns, port)):
        return None
    network.pods[pod.name] = pod_ns
    applied = _access_link_record(network, pod, pod_ns)
    network.applied.update(applied)
    return applied


def _access_link_record(network: Network, pod: Pod, pod_ns: str) -> dict[str, str]:
    """What `pod`'s access link got at its two ends, in words (their rates recorded)."""
    rack = network.topology.racks[pod.rack]
    port, own = naming.rack_port(pod.slot), network.wiring.ifname
    applied = {}
    for ns, ifname, ops in ((pod_ns, own, network.pod_end_ops),
                            (rack.netns, port, network.access_ops)):
        applied[f"{ns}/{ifname}"] = f"{shaping.describe(ops)}, gso_max_size {shaping.GSO_BYTES}"
        network.rate_bit[f"{ns}/{ifname}"] = shaping.rate_bit(ops)
    if network.wire_end_ops:
        applied[f"{rack.netns}/{port}"] += f", ingress: {shaping.describe(network.wire_end_ops)}"
    if shaping.drops_packets(network.access_ops) or shaping.drops_packets(network.uplink_ops):
        applied[f"{pod_ns}/{own}"] += ", gso_max_segs 1"
    return applied


def _link_exists(ns: str, ifname: str) -> bool:
    if not netns.exists(ns):
        return False
    with netns.ipr(ns) as ipr:
        return bool(ipr.link_lookup(ifname=ifname))


def remove_fabric(network: Network) -> None:
    """Undo build_fabric: droppers detached, the links deleted (the kernel frees an
    unnamed namespace only later, and a VXLAN device left registered until then
    would refuse its successor), the spine and rack namespaces it built removed."""
    topo = network.topology
    mine = [topo.racks[i].netns for i in network.racks] + [topo.spine_netns]
    try:
        network._detach_all(how="release")   # the links go next
    finally:
        network.pods.clear()
        clean.remove([ns for ns in mine if netns.exists(ns)])


def wire_pod(network: Network, pod: Pod, pod_ns: str) -> dict[str, str]:
    """Join `pod`, whose network namespace is `pod_ns`, to its rack of a built fabric:
    access link, address, routes, shaping of both directions, neighbour entries.
    Returns what was applied on its two ends. All or nothing."""
    sockets = Sockets()
    try:
        before = set(network.applied)
        _wire_pod(network, pod, pod_ns, sockets)
        rack = network.topology.racks[pod.rack]
        # Only its two ends: a pod's namespace may hold links of others (a CNI's
        # tunnel devices are often down), which are not ours to wait for.
        _wait_until_up([pod_ns, rack.netns], [(pod_ns, network.wiring.ifname),
                                              (rack.netns, naming.rack_port(pod.slot))])
        return {k: v for k, v in network.applied.items() if k not in before}
    except BaseException:
        unwire_pod(network, pod)
        raise
    finally:
        sockets.close()


def unwire_pod(network: Network, pod: Pod) -> None:
    """Remove `pod`'s access link (both ends go with the veth); its pod namespace and
    everything else stay. Already gone is fine."""
    try:
        detach_all(network.pod_droppers.pop(pod.name, []))
    finally:
        _delete_access_link(network, pod)


def _delete_access_link(network: Network, pod: Pod) -> None:
    rack = network.topology.racks[pod.rack]
    port = naming.rack_port(pod.slot)
    pod_ns = network.pods.pop(pod.name, None)
    network.pod_ifindex.pop(pod.name, None)
    for key in [f"{rack.netns}/{port}"] + ([f"{pod_ns}/{network.wiring.ifname}"]
                                           if pod_ns else []):
        network.applied.pop(key, None)
    if not netns.exists(rack.netns):
        return
    with netns.ipr(rack.netns) as ipr:
        found = ipr.link_lookup(ifname=port)
        if found:
            ipr.link("del", index=found[0])


def _build_fabric(network: Network, racks: tuple[Rack, ...], sockets: Sockets) -> None:
    topo = network.topology
    netns.create(topo.spine_netns)
    for rack in racks:
        netns.create(rack.netns)
        network.racks.append(rack.index)
        network.spine_ifindex[rack.index] = _build_rack(topo, rack, sockets)
        network.bridges[f"{rack.netns}/{naming.TOR_BRIDGE}"] = \
            _bridge_netfilter_off(rack.netns)
        forwarding.enable(topo.spine_netns, naming.spine_port(rack.index))
        _shape(network, sockets, rack.netns, naming.RACK_UPLINK_IF,
               network.uplink_ops, network.droppers)                    # rack -> spine
        _shape(network, sockets, topo.spine_netns, naming.spine_port(rack.index),
               network.uplink_ops, network.droppers)                    # spine -> rack


# A new namespace's bridge hands every packet it forwards to the IPv4, IPv6 and ARP
# netfilter hooks (br_netfilter is built in, and these are 1 in each new namespace),
# a cost per packet that a switch does not have; nothing of tailcut filters there.
BRIDGE_NETFILTER = ("bridge-nf-call-iptables", "bridge-nf-call-ip6tables",
                    "bridge-nf-call-arptables")


def _bridge_netfilter_off(ns: str) -> str:
    """Turn the bridge's netfilter calls off in namespace `ns`; say what was done. A
    container's /proc/sys is read-only (the Kubernetes agent's): then they stay on."""
    try:
        with netns.entered(ns):   # /proc/sys/net is the opening thread's namespace's
            for key in BRIDGE_NETFILTER:
                with open(f"/proc/sys/net/bridge/{key}", "w") as f:
                    f.write("0")
    except FileNotFoundError:
        return "bridge (no bridge netfilter in this kernel)"
    except OSError as err:
        return f"bridge, netfilter calls left on ({err.strerror} writing /proc/sys)"
    return "bridge, netfilter calls off"


def _build_rack(topo: Topology, rack: Rack, sockets: Sockets) -> int:
    """The rack's namespace, bridge and uplink; returns the spine port's ifindex."""
    ipr = sockets[rack.netns]
    alias = naming.alias(topo.job)
    # The bridge gets the MTU too: until it has ports it would sit at 1500, and a
    # bridge set explicitly keeps its MTU rather than following the least of its ports.
    ipr.link("add", ifname=naming.TOR_BRIDGE, kind="bridge", mtu=topo.mtu)
    tor = ipr.link_lookup(ifname=naming.TOR_BRIDGE)[0]
    ipr.link("set", index=tor, ifalias=alias, group=naming.GROUP, state="up")
    # Uplink: rack end "up" on the bridge, spine end "r<rack>" as the gateway.
    spine_if = naming.spine_port(rack.index)
    ipr.link("add", ifname=naming.RACK_UPLINK_IF, kind="veth", mtu=topo.mtu,
             peer={"ifname": spine_if, "net_ns_fd": netns.path(topo.spine_netns),
                   "mtu": topo.mtu, "address": naming.mac_of(rack.gateway)})
    _attach_port(ipr, naming.RACK_UPLINK_IF, tor, alias)
    spine = sockets[topo.spine_netns]
    idx = spine.link_lookup(ifname=spine_if)[0]
    spine.addr("add", index=idx, address=rack.gateway, prefixlen=24)
    spine.link("set", index=idx, ifalias=alias, group=naming.GROUP, state="up")
    return int(idx)


def _wire_pod(network: Network, pod: Pod, pod_ns: str, sockets: Sockets,
              pin: bool = True) -> None:
    """Wire `pod`; `pin` its neighbour entries now, or leave them to the caller
    (build pins every pod's at once)."""
    # Raw batches (tailcut.net.rtnl), two requests' worth of round trips per end: a
    # pod is wired in ~20 netlink messages, and pyroute2 took a millisecond for each.
    topo, wiring = network.topology, network.wiring
    rack = topo.racks[pod.rack]
    alias = naming.alias(topo.job)
    port = naming.rack_port(pod.slot)
    rack_sock, pod_sock = sockets.rtnl(rack.netns), sockets.rtnl(pod_ns)
    tor = network.tor_ifindex.get(rack.index)
    if tor is None:
        tor = network.tor_ifindex[rack.index] = rtnl.ifindex(rack_sock, naming.TOR_BRIDGE)
    fd = netns.enter_fd(pod_ns)
    try:
        create = rtnl.Batch()
        create.veth_add(port, wiring.ifname, fd, mtu=topo.mtu, group=naming.GROUP,
                        master=tor, peer_mac=naming.mac_of(pod.ip))
        create.send(rack_sock)
    finally:
        os.close(fd)
    network.pods[pod.name] = pod_ns
    index = rtnl.ifindex(pod_sock, wiring.ifname)
    network.pod_ifindex[pod.name] = index
    drops = (shaping.drops_packets(network.access_ops)
             or shaping.drops_packets(network.uplink_ops))
    own = rtnl.Batch()
    own.addr_add(index, pod.ip, 24)
    # Pods are the only senders: with loss on the path their skbs must cross every hop
    # as one wire packet each (shaping.drops_packets); and no GSO packet is larger than
    # the link's HTB lets out at once (shaping.GSO_BYTES), at either end.
    own.set_link(index, alias=alias, up=True, gso_max_segs=1 if drops else None,
                 gso_max_size=shaping.GSO_BYTES)
    if wiring.default_route:
        own.route_add("0.0.0.0/0", rack.gateway)
    else:
        for other in topo.racks:
            if other.index != rack.index:
                own.route_add(other.subnet, rack.gateway)
    tc.add_requests(own, network.pod_end_ops, index)
    # (kept before sending: a failed build releases them)
    droppers = network.pod_droppers.setdefault(pod.name, [])
    droppers += tc.add_dropper_requests(own, network.pod_end_ops, pod_ns,
                                        wiring.ifname, index, network.attacher)
    own.send(pod_sock)
    port_index = rtnl.ifindex(rack_sock, port)
    ports = rtnl.Batch()
    ports.set_link(port_index, alias=alias, up=True, gso_max_size=shaping.GSO_BYTES)
    tc.add_requests(ports, network.access_ops, port_index)
    droppers += tc.add_dropper_requests(ports, network.access_ops, rack.netns, port,
                                        port_index, network.attacher)
    droppers += tc.add_dropper_requests(ports, network.wire_end_ops, rack.netns, port,
                                        port_index, network.attacher, "ingress")
    ports.send(rack_sock)
    network.applied.update(_access_link_record(network, pod, pod_ns))
    if pin:
        _pin_neighbours(network, [pod])


def _shape(network: Network, sockets: Sockets, ns: str, ifname: str,
           ops: list[shaping.Op], droppers: list[object], index: Optional[int] = None) -> None:
    """tc.apply's qdiscs and classes, sent as one batch, then its droppers."""
    if index is None:
        index = sockets[ns].link_lookup(ifname=ifname)[0]
    batch = rtnl.Batch()
    tc.add_requests(batch, ops, index)
    rtnl.send_in(ns, batch)
    droppers += tc.attach_droppers(ops, ns, ifname, network.attacher)
    network.applied[f"{ns}/{ifname}"] = shaping.describe(ops)
    network.rate_bit[f"{ns}/{ifname}"] = shaping.rate_bit(ops)


def _attach_port(ipr: IPRoute, ifname: str, bridge_index: int, alias: str) -> int:
    idx = int(ipr.link_lookup(ifname=ifname)[0])
    ipr.link("set", index=idx, master=bridge_index, ifalias=alias, group=naming.GROUP,
             state="up")
    return idx


def _pin_neighbours(network: Network, pods: list[Pod]) -> None:
    """Permanent ARP entries between each of `pods` and its gateway and the other wired
    pods of its rack. Address resolution is not what a job emulates, and on a lossy
    link a lost ARP request stalls a flow for a whole second (its retry timer) while
    every packet queued behind it is dropped. Every MAC is its address's
    (naming.mac_of), so the entries (a rack of k pods: k * k of them) go out in one
    batch per namespace, with no lookup."""
    topo, spine = network.topology, network.topology.spine_netns
    batches: dict[str, rtnl.Batch] = {}
    pinned: set[tuple[str, str]] = set()

    def pin(ns: str, index: int, ip: str) -> None:
        if (ns, ip) not in pinned:
            pinned.add((ns, ip))
            batches.setdefault(ns, rtnl.Batch()).neigh_replace(index, ip, naming.mac_of(ip))

    def ifindex(pod: Pod) -> int:   # recorded by _wire_pod; looked up if not
        if pod.name not in network.pod_ifindex:
            with rtnl.socket_in(network.pods[pod.name]) as sock:
                network.pod_ifindex[pod.name] = rtnl.ifindex(sock, network.wiring.ifname)
        return network.pod_ifindex[pod.name]

    for pod in pods:
        rack = topo.racks[pod.rack]
        pod_ns, own = network.pods[pod.name], ifindex(pod)
        gateway = network.spine_ifindex.get(rack.index)
        if gateway is None:   # a fabric built by another process (the agent restarted)
            with netns.ipr(spine) as ipr:
                gateway = network.spine_ifindex[rack.index] = int(
                    ipr.link_lookup(ifname=naming.spine_port(rack.index))[0])
        pin(spine, gateway, pod.ip)
        pin(pod_ns, own, rack.gateway)
        for other in rack.pods:
            other_ns = network.pods.get(other.name)
            if other is pod or other_ns is None:
                continue
            pin(pod_ns, own, other.ip)
            pin(other_ns, ifindex(other), pod.ip)
    for ns, batch in batches.items():
        rtnl.send_in(ns, batch)


def _wait_until_up(namespaces: list[str], only: list[tuple[str, str]] | None = None) -> None:
    """Wait for every veth in `namespaces` (or only the (namespace, interface) pairs
    `only`) to be operationally up and every bridge port forwarding: a packet sent
    earlier can wait a second for an ARP retry."""
    socks = {ns: rtnl.socket_in(ns) for ns in namespaces}
    try:
        deadline = time.monotonic() + UP_TIMEOUT_S
        pending = _not_ready(socks, only)
        while pending and time.monotonic() < deadline:
            time.sleep(0.01)
            pending = _not_ready(socks, only)
    finally:
        for sock in socks.values():
            sock.close()
    if pending:
        raise NetError(f"links not up after {UP_TIMEOUT_S} s: {', '.join(pending)}")


def _not_ready(socks: dict[str, socket.socket],
               only: list[tuple[str, str]] | None = None) -> list[str]:
    pending = []
    for ns, sock in socks.items():
        for name, oper, port_state in rtnl.link_states(sock):
            if name == "lo" or name == naming.TOR_BRIDGE or (
                    only is not None and (ns, name) not in only):
                continue
            # (a VXLAN device has no carrier to report: UNKNOWN once up)
            if oper not in ("UP", "UNKNOWN"):
                pending.append(f"{ns}/{name}")
                continue
            if port_state is not None and port_state != BR_FORWARDING:
                pending.append(f"{ns}/{name} (bridge port not forwarding)")
    return pending


def teardown(job: str, wait_s: float = 5.0) -> list[str]:
    """Remove every namespace of `job` (and so every link, qdisc and tc program in
    them) after ending the processes inside. Returns the namespaces removed."""
    return clean.remove_job(job, wait_s)


def mac_of(ns: str, ifname: str) -> str:
    """The MAC address of ``ifname`` in namespace ``ns``."""
    with netns.ipr(ns) as ipr:
        found = ipr.link_lookup(ifname=ifname)
        if not found:
            raise NetError(f"{ns}/{ifname}: no such interface")
        return str(ipr.get_links(found[0])[0].get_attr("IFLA_ADDRESS"))


def point_at_tor(network: Network, rack_index: int, pods: Sequence[Pod], spine: bool,
                 address: str, mac: str) -> None:
    """Make an address served by a ToR program of rack ``rack_index`` (the hot-parameter
    store's, naming.hot_store_ip; aggregation's, naming.aggregation_ip) reachable from
    these pods of the rack (and from the spine, for the other racks): a permanent
    neighbour entry for it with its fixed MAC. No host owns the address; packets for it
    reach the rack's ports, where the program on their ingress takes them."""
    topo, ifname = network.topology, network.wiring.ifname
    targets = [(network.pods[p.name], ifname) for p in pods]
    if spine:
        targets.append((topo.spine_netns, naming.spine_port(rack_index)))
    sockets = Sockets()
    try:
        for ns, name in targets:
            index = sockets[ns].link_lookup(ifname=name)[0]
            sockets[ns].neigh("replace", dst=address, lladdr=mac,
                              ifindex=index, state=NUD_PERMANENT)
    finally:
        sockets.close()
