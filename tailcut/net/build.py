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
"""

import time
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from pyroute2 import IPRoute

from tailcut.errors import AlreadyExists, NetError, detach_all
from tailcut.net import clean, forwarding, naming, netns, offload, shaping
from tailcut.net.topology import Pod, Rack, Topology

UP_TIMEOUT_S = 5.0
BR_FORWARDING = 3  # IFLA_BRPORT_STATE value of a forwarding bridge port
NUD_PERMANENT = 0x80  # a neighbour entry that never expires or gets probed


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
    """One netlink socket per namespace, opened on first use."""

    def __missing__(self, ns: str) -> IPRoute:
        self[ns] = netns.ipr(ns)
        return self[ns]

    def close(self) -> None:
        for sock in self.values():
            sock.close()
        self.clear()


@dataclass
class Network:
    """A built topology (or the part of it on one node): what was applied where, and
    the handles to undo it."""

    topology: Topology
    wiring: PodWiring = LOCAL
    access_ops: list[shaping.Op] = field(default_factory=list)   # the rack's port
    uplink_ops: list[shaping.Op] = field(default_factory=list)
    pod_end_ops: list[shaping.Op] = field(default_factory=list)  # the pod's own end
    applied: dict[str, str] = field(default_factory=dict)   # "ns/ifname" -> description
    droppers: list[object] = field(default_factory=list)    # on the fabric's links
    pods: dict[str, str] = field(default_factory=dict)      # wired pod -> its namespace
    pod_droppers: dict[str, list[object]] = field(default_factory=dict)
    racks: list[int] = field(default_factory=list)          # built here (build_fabric)

    def destroy(self) -> None:
        """Detach the eBPF droppers (releasing our hold on their programs) and remove
        every namespace of the job."""
        self._detach_all()
        teardown(self.topology.job)

    def _detach_all(self) -> None:
        everything = self.droppers + [d for ds in self.pod_droppers.values() for d in ds]
        self.droppers, self.pod_droppers = [], {}
        detach_all(everything)

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
        (tailcut.net.shaping.queue_drops), apart from the eBPF droppers' random loss.
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
                    drops = shaping.queue_drops(ipr, ifname)
                    if drops is not None:
                        out[f"{ns}/{ifname}"] = drops
        return out

    def pod_link_bytes(self) -> dict[str, dict[str, int]]:
        """Per wired pod, what its end of the access link sent and received so far
        (the kernel's counters of its interface): the bytes on each pod's link."""
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


def _network(topo: Topology, has_netem: bool, wiring: PodWiring) -> Network:
    """An empty Network with the shaping of the access link (at the rack's port, and at
    the pod's own end, which has no switch buffer) and of the uplink; raises for a link
    the kernel cannot emulate, before anything exists."""
    field, mtu = "spec.network.accessLink", topo.mtu
    return Network(
        topology=topo, wiring=wiring,
        access_ops=shaping.plan(topo.access_link, has_netem, field, mtu),
        pod_end_ops=shaping.plan(shaping.host_end(topo.access_link), has_netem, field, mtu),
        uplink_ops=shaping.plan(topo.uplink, has_netem, "spec.network.uplink", mtu))


def build(topo: Topology, has_netem: bool) -> Network:
    """Create every namespace, bridge, veth, address, route and qdisc of `topo`.
    On any failure, whatever was created is removed before the error propagates."""
    network = _network(topo, has_netem, LOCAL)
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
            _wire_pod(network, pod, pod.netns, sockets)
        _wait_until_up(sockets)
        return network
    except BaseException:
        network.destroy()
        raise
    finally:
        sockets.close()


def build_fabric(topo: Topology, racks: Iterable[Rack], has_netem: bool,
                 wiring: PodWiring = KUBERNETES) -> Network:
    """The spine and `racks` of `topo` with their uplinks, shaped both ways, and no
    pod yet: wire_pod adds them one by one. All or nothing."""
    network = _network(topo, has_netem, wiring)
    sockets = Sockets()
    try:
        _build_fabric(network, tuple(racks), sockets)
        return network
    except BaseException:
        remove_fabric(network)
        raise
    finally:
        sockets.close()


def remove_fabric(network: Network) -> None:
    """Undo build_fabric: droppers detached, the links deleted (the kernel frees an
    unnamed namespace only later, and a VXLAN device left registered until then
    would refuse its successor), the spine and rack namespaces it built removed."""
    topo = network.topology
    mine = [topo.racks[i].netns for i in network.racks] + [topo.spine_netns]
    try:
        network._detach_all()
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
        _wait_until_up(sockets, [(pod_ns, network.wiring.ifname),
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
        _build_rack(topo, rack, sockets)
        forwarding.enable(topo.spine_netns, naming.spine_port(rack.index))
        _shape(network, sockets, rack.netns, naming.RACK_UPLINK_IF,
               network.uplink_ops, network.droppers)                    # rack -> spine
        _shape(network, sockets, topo.spine_netns, naming.spine_port(rack.index),
               network.uplink_ops, network.droppers)                    # spine -> rack


def _build_rack(topo: Topology, rack: Rack, sockets: Sockets) -> None:
    ipr = sockets[rack.netns]
    alias = naming.alias(topo.job)
    # The bridge gets the MTU too: until it has ports it would sit at 1500, and a
    # bridge set explicitly keeps its MTU rather than following the least of its ports.
    ipr.link("add", ifname=naming.TOR_BRIDGE, kind="bridge", mtu=topo.mtu)
    tor = ipr.link_lookup(ifname=naming.TOR_BRIDGE)[0]
    ipr.link("set", index=tor, ifalias=alias, state="up")
    # Uplink: rack end "up" on the bridge, spine end "r<rack>" as the gateway.
    spine_if = naming.spine_port(rack.index)
    ipr.link("add", ifname=naming.RACK_UPLINK_IF, kind="veth", mtu=topo.mtu,
             peer={"ifname": spine_if, "net_ns_fd": netns.path(topo.spine_netns),
                   "mtu": topo.mtu})
    _attach_port(ipr, naming.RACK_UPLINK_IF, tor, alias)
    spine = sockets[topo.spine_netns]
    idx = spine.link_lookup(ifname=spine_if)[0]
    spine.addr("add", index=idx, address=rack.gateway, prefixlen=24)
    spine.link("set", index=idx, ifalias=alias, state="up")


def _wire_pod(network: Network, pod: Pod, pod_ns: str, sockets: Sockets) -> None:
    topo, wiring = network.topology, network.wiring
    rack = topo.racks[pod.rack]
    ipr = sockets[rack.netns]
    alias = naming.alias(topo.job)
    port = naming.rack_port(pod.slot)
    ipr.link("add", ifname=port, kind="veth", mtu=topo.mtu,
             peer={"ifname": wiring.ifname, "net_ns_fd": netns.path(pod_ns),
                   "mtu": topo.mtu})
    network.pods[pod.name] = pod_ns
    _attach_port(ipr, port, ipr.link_lookup(ifname=naming.TOR_BRIDGE)[0], alias)
    offload.cut_udp_gso_at(rack.netns, [port])
    pod_ipr = sockets[pod_ns]
    index = pod_ipr.link_lookup(ifname=wiring.ifname)[0]
    pod_ipr.addr("add", index=index, address=pod.ip, prefixlen=24)
    pod_ipr.link("set", index=index, ifalias=alias, state="up")
    if wiring.default_route:
        pod_ipr.route("add", dst="0.0.0.0/0", gateway=rack.gateway)
    else:
        for other in topo.racks:
            if other.index != rack.index:
                pod_ipr.route("add", dst=other.subnet, gateway=rack.gateway)
    droppers = network.pod_droppers.setdefault(pod.name, [])
    _shape(network, sockets, pod_ns, wiring.ifname, network.pod_end_ops, droppers)
    _shape(network, sockets, rack.netns, port, network.access_ops, droppers)
    if shaping.drops_packets(network.access_ops) or shaping.drops_packets(network.uplink_ops):
        # Pods are the only senders: their skbs cross every hop, one wire packet each.
        pod_ipr.link("set", index=index, gso_max_segs=1)
        network.applied[f"{pod_ns}/{wiring.ifname}"] += ", gso_max_segs 1"
    _pin_neighbours(network, pod, sockets)


def _shape(network: Network, sockets: Sockets, ns: str, ifname: str,
           ops: list[shaping.Op], droppers: list[object]) -> None:
    droppers += shaping.apply(ops, sockets[ns], ns, ifname)
    network.applied[f"{ns}/{ifname}"] = shaping.describe(ops)


def _attach_port(ipr: IPRoute, ifname: str, bridge_index: int, alias: str) -> None:
    idx = ipr.link_lookup(ifname=ifname)[0]
    ipr.link("set", index=idx, master=bridge_index, ifalias=alias, state="up")


def _pin_neighbours(network: Network, pod: Pod, sockets: Sockets) -> None:
    """Permanent ARP entries between `pod` and its gateway and the pods of its rack
    wired before it. Address resolution is not what a job emulates, and on a lossy
    link a lost ARP request stalls a flow for a whole second (its retry timer) while
    every packet queued behind it is dropped."""
    topo, ifname = network.topology, network.wiring.ifname
    rack = topo.racks[pod.rack]

    def mac(ns: str, name: str) -> tuple[int, str]:
        idx = sockets[ns].link_lookup(ifname=name)[0]
        return idx, sockets[ns].get_links(idx)[0].get_attr("IFLA_ADDRESS")

    def pin(ns: str, index: int, ip: str, lladdr: str) -> None:
        sockets[ns].neigh("replace", dst=ip, lladdr=lladdr, ifindex=index,
                          state=NUD_PERMANENT)

    pod_ns = network.pods[pod.name]
    own_index, own_mac = mac(pod_ns, ifname)
    gw_index, gw_mac = mac(topo.spine_netns, naming.spine_port(rack.index))
    pin(topo.spine_netns, gw_index, pod.ip, own_mac)
    pin(pod_ns, own_index, rack.gateway, gw_mac)
    for other in rack.pods:
        other_ns = network.pods.get(other.name)
        if other is pod or other_ns is None:
            continue
        other_index, other_mac = mac(other_ns, ifname)
        pin(pod_ns, own_index, other.ip, other_mac)
        pin(other_ns, other_index, pod.ip, own_mac)


def _wait_until_up(sockets: Sockets, only: list[tuple[str, str]] | None = None) -> None:
    """Wait for every veth in the namespaces of `sockets` (or only the (namespace,
    interface) pairs `only`) to be operationally up and every bridge port forwarding:
    a packet sent earlier can wait a second for an ARP retry."""
    deadline = time.monotonic() + UP_TIMEOUT_S
    pending = _not_ready(sockets, only)
    while pending and time.monotonic() < deadline:
        time.sleep(0.01)
        pending = _not_ready(sockets, only)
    if pending:
        raise NetError(f"links not up after {UP_TIMEOUT_S} s: {', '.join(pending)}")


def _not_ready(sockets: Sockets, only: list[tuple[str, str]] | None = None) -> list[str]:
    pending = []
    for ns, ipr in list(sockets.items()):
        for link in ipr.get_links():
            name = link.get_attr("IFLA_IFNAME")
            if name == "lo" or name == naming.TOR_BRIDGE or (
                    only is not None and (ns, name) not in only):
                continue
            # (a VXLAN device has no carrier to report: UNKNOWN once up)
            if link.get_attr("IFLA_OPERSTATE") not in ("UP", "UNKNOWN"):
                pending.append(f"{ns}/{name}")
                continue
            info = link.get_attr("IFLA_PROTINFO")
            if info is not None and info.get_attr("IFLA_BRPORT_STATE") != BR_FORWARDING:
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
