"""Build a planned Topology in the kernel, and tear it down again.

Rack r's ToR is a bridge in its own namespace; the spine is one namespace routing
between the rack subnets. Pods hang off their ToR by a veth (the access link), racks
off the spine by a veth (the uplink); each end of each veth shapes its own egress, so
both directions of a link are shaped:

    pod ns            rack ns                         spine ns
    eth0 ==access== p<slot> -[tor bridge]- up ==uplink== r<rack> (gateway, routes)
"""

import time
from dataclasses import dataclass, field

from pyroute2 import IPRoute

from tailcut.errors import AlreadyExists, NetError
from tailcut.net import clean, naming, netns, shaping
from tailcut.net.topology import Rack, Topology

UP_TIMEOUT_S = 5.0
BR_FORWARDING = 3  # IFLA_BRPORT_STATE value of a forwarding bridge port
NUD_PERMANENT = 0x80  # a neighbour entry that never expires or gets probed


@dataclass
class Network:
    """A built topology: what was applied where, and the handles to undo it."""

    topology: Topology
    applied: dict[str, str] = field(default_factory=dict)   # "ns/ifname" -> description
    droppers: list[object] = field(default_factory=list)

    def destroy(self) -> None:
        """Detach the eBPF droppers (releasing our hold on their programs) and remove
        every namespace of the job."""
        for d in self.droppers:
            d.detach()  # type: ignore[attr-defined]
        teardown(self.topology.job)

    def dropper_counts(self) -> tuple[int, int]:
        """(passed, dropped) packets summed over every eBPF dropper of the run."""
        passed = dropped = 0
        for d in self.droppers:
            p, q = d.counts()  # type: ignore[attr-defined]
            passed, dropped = passed + p, dropped + q
        return passed, dropped


def build(topo: Topology, has_netem: bool) -> Network:
    """Create every namespace, bridge, veth, address, route and qdisc of `topo`.
    On any failure, whatever was created is removed before the error propagates."""
    # Plan the shaping first: a link the kernel cannot emulate fails before anything exists.
    access_ops = shaping.plan(topo.access_link, has_netem, "spec.network.accessLink")
    uplink_ops = shaping.plan(topo.uplink, has_netem, "spec.network.uplink")
    taken = [n for n in topo.namespaces() if netns.exists(n)]
    if taken:
        raise AlreadyExists(f"job {topo.job!r} already has namespaces on this host "
                            f"({', '.join(taken[:3])}...): a run is still going or one was "
                            f"killed; `tailcut clean {topo.job}` removes its leftovers")
    network = Network(topology=topo)
    sockets: dict[str, IPRoute] = {}
    try:
        for name in topo.namespaces():
            netns.create(name)
            sockets[name] = netns.ipr(name)
        _build_spine(topo, sockets[topo.spine_netns])
        for rack in topo.racks:
            _build_rack(topo, rack, sockets)
        _shape_all(topo, network, sockets, access_ops, uplink_ops)
        _pin_neighbours(topo, sockets)
        _wait_until_up(topo, sockets)
        return network
    except BaseException:
        network.destroy()
        raise
    finally:
        for sock in sockets.values():
            sock.close()


def _build_spine(topo: Topology, spine: IPRoute) -> None:
    with netns.entered(topo.spine_netns):
        # Per-namespace sysctl: the host's own forwarding setting is never touched.
        with open("/proc/sys/net/ipv4/ip_forward", "w") as f:
            f.write("1")


def _build_rack(topo: Topology, rack: Rack, sockets: dict[str, IPRoute]) -> None:
    ipr = sockets[rack.netns]
    alias = naming.alias(topo.job)
    ipr.link("add", ifname=naming.TOR_BRIDGE, kind="bridge")
    tor = ipr.link_lookup(ifname=naming.TOR_BRIDGE)[0]
    ipr.link("set", index=tor, ifalias=alias, state="up")
    # Uplink: rack end "up" on the bridge, spine end "r<rack>" as the gateway.
    spine_if = naming.spine_port(rack.index)
    ipr.link("add", ifname=naming.RACK_UPLINK_IF, kind="veth",
             peer={"ifname": spine_if, "net_ns_fd": netns.path(topo.spine_netns)})
    _attach_port(ipr, naming.RACK_UPLINK_IF, tor, alias)
    spine = sockets[topo.spine_netns]
    idx = spine.link_lookup(ifname=spine_if)[0]
    spine.addr("add", index=idx, address=rack.gateway, prefixlen=24)
    spine.link("set", index=idx, ifalias=alias, state="up")
    for pod in rack.pods:
        port = naming.rack_port(pod.slot)
        ipr.link("add", ifname=port, kind="veth",
                 peer={"ifname": naming.POD_IF, "net_ns_fd": netns.path(pod.netns)})
        _attach_port(ipr, port, tor, alias)
        pod_ipr = sockets[pod.netns]
        eth0 = pod_ipr.link_lookup(ifname=naming.POD_IF)[0]
        pod_ipr.addr("add", index=eth0, address=pod.ip, prefixlen=24)
        pod_ipr.link("set", index=eth0, ifalias=alias, state="up")
        pod_ipr.route("add", dst="0.0.0.0/0", gateway=rack.gateway)


def _attach_port(ipr: IPRoute, ifname: str, bridge_index: int, alias: str) -> None:
    idx = ipr.link_lookup(ifname=ifname)[0]
    ipr.link("set", index=idx, master=bridge_index, ifalias=alias, state="up")


def _shape_all(topo: Topology, network: Network, sockets: dict[str, IPRoute],
               access_ops: list[shaping.Op], uplink_ops: list[shaping.Op]) -> None:
    def shape(ns: str, ifname: str, ops: list[shaping.Op]) -> None:
        network.droppers += shaping.apply(ops, sockets[ns], ns, ifname)
        network.applied[f"{ns}/{ifname}"] = shaping.describe(ops)

    wire_packets = shaping.drops_packets(access_ops) or shaping.drops_packets(uplink_ops)
    for rack in topo.racks:
        shape(rack.netns, naming.RACK_UPLINK_IF, uplink_ops)                # rack -> spine
        shape(topo.spine_netns, naming.spine_port(rack.index), uplink_ops)  # spine -> rack
        for pod in rack.pods:
            shape(pod.netns, naming.POD_IF, access_ops)                     # pod -> rack
            shape(rack.netns, naming.rack_port(pod.slot), access_ops)       # rack -> pod
            if wire_packets:  # pods are the only senders: their skbs cross every hop
                ipr = sockets[pod.netns]
                ipr.link("set", index=ipr.link_lookup(ifname=naming.POD_IF)[0],
                         gso_max_segs=1)
                network.applied[f"{pod.netns}/{naming.POD_IF}"] += ", gso_max_segs 1"


def _pin_neighbours(topo: Topology, sockets: dict[str, IPRoute]) -> None:
    """Fill every ARP table with permanent entries. Address resolution is not what a
    job emulates, and on a lossy link a lost ARP request stalls a flow for a whole
    second (its retry timer) while every packet queued behind it is dropped."""
    def mac(ns: str, ifname: str) -> tuple[int, str]:
        idx = sockets[ns].link_lookup(ifname=ifname)[0]
        return idx, sockets[ns].get_links(idx)[0].get_attr("IFLA_ADDRESS")

    spine = sockets[topo.spine_netns]
    for rack in topo.racks:
        gw_index, gw_mac = mac(topo.spine_netns, naming.spine_port(rack.index))
        hosts = {pod.ip: (pod.netns, *mac(pod.netns, naming.POD_IF)) for pod in rack.pods}
        for ip, (_, _, pod_mac) in hosts.items():
            spine.neigh("replace", dst=ip, lladdr=pod_mac, ifindex=gw_index, state=NUD_PERMANENT)
        for ns, index, _ in hosts.values():
            known = [(rack.gateway, gw_mac)] + [(ip, h[2]) for ip, h in hosts.items()
                                                if h[0] != ns]
            for ip, lladdr in known:
                sockets[ns].neigh("replace", dst=ip, lladdr=lladdr, ifindex=index,
                                  state=NUD_PERMANENT)


def _wait_until_up(topo: Topology, sockets: dict[str, IPRoute]) -> None:
    """Wait for every veth to be operationally up and every bridge port forwarding:
    a packet sent earlier can wait a second for an ARP retry."""
    deadline = time.monotonic() + UP_TIMEOUT_S
    pending = _not_ready(topo, sockets)
    while pending and time.monotonic() < deadline:
        time.sleep(0.01)
        pending = _not_ready(topo, sockets)
    if pending:
        raise NetError(f"links not up after {UP_TIMEOUT_S} s: {', '.join(pending)}")


def _not_ready(topo: Topology, sockets: dict[str, IPRoute]) -> list[str]:
    pending = []
    for ns, ipr in sockets.items():
        for link in ipr.get_links():
            name = link.get_attr("IFLA_IFNAME")
            if name == "lo" or name == naming.TOR_BRIDGE:
                continue
            if link.get_attr("IFLA_OPERSTATE") != "UP":
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
