"""A job's MTU on a real built network: every link carries it, and bounded-loss
datagrams of that size cross it whole (counted by the XDP counter, not fragmented)."""

import numpy as np
import pytest

from tailcut import spec
from tailcut.datapath import dropper
from tailcut.net import build, netns, topology
from tailcut.transports import datagram, wire
from tailcut.transports.base import Kind, Message
from tests.transports.test_datagram import delivered, pair

pytestmark = pytest.mark.netns

VECTOR = np.random.default_rng(2).standard_normal(64_750).astype(np.float32)  # 259 KB


@pytest.fixture
def jumbo():
    """Two racks (so a message crosses access links, both uplinks and the spine), mtu
    9000, 5% loss on each uplink's ends (~10% a path) so bounded-loss must retransmit
    up to p and stop there. (Much more loss also loses the TCP control channel's
    segments often enough to back its retransmission timer off past the timeout on
    this loaded machine.)"""
    job = spec.load_text(
        "kind: TrainingJob\nmetadata: {name: mtu}\n"
        "spec: {replicas: {workers: 1}, network: {mtu: 9000,"
        " racks: [{name: a}, {name: b}], placement: {ps-0: a, worker-0: b},"
        " uplink: {loss: 0.05}}}\n")
    network = build.build(topology.plan(job), has_netem=False, droppers=dropper)
    try:
        yield network
    finally:
        network.destroy()


def mtus(ns: str) -> dict[str, int]:
    with netns.ipr(ns) as ipr:
        return {link.get_attr("IFLA_IFNAME"): link.get_attr("IFLA_MTU")
                for link in ipr.get_links() if link.get_attr("IFLA_IFNAME") != "lo"}


@pytest.mark.bpf
def test_a_9000_byte_mtu_is_on_every_link_and_carries_whole_bounded_loss_datagrams(jumbo):
    topo = jumbo.topology
    seen = {f"{ns}/{name}": mtu for ns in topo.namespaces() for name, mtu in mtus(ns).items()}
    # pods' eth0, rack ports p0, the ToR bridges, the uplinks' two ends
    assert len(seen) == 2 + 2 + 2 + 2 + 2, seen
    assert set(seen.values()) == {9000}, seen
    ps, worker = topo.pod("ps-0"), topo.pod("worker-0")
    with pair("bounded-loss", 27310, lambda: netns.entered(ps.netns),
              lambda: netns.entered(worker.netns), host=ps.ip, p=0.9, job="mtu",
              mtu=9000) as (server, s, client, c):
        assert server.stride == client.stride == wire.elements_per_packet(9000) == 2235
        for i in range(5):
            c.send(Message(Kind.PUSH, i, 1, VECTOR), 30)
            msg = s.recv(30)
            ok = delivered(msg)
            assert ok.sum() >= datagram.threshold_elements(0.9, VECTOR.size)
            assert np.array_equal(msg.values[ok], VECTOR[ok])
        # 29 datagrams of 2235 floats (8968 bytes of UDP payload) a message; the XDP
        # counter counts only whole, slot-aligned ones, so fragments would not count.
        slots = wire.slots(VECTOR.size, 2235)
        assert slots == 29
        counted = server.counter.stats()["counted"]
        assert counted >= 5 * datagram.threshold_elements(0.9, VECTOR.size) // 2235, counted
    with netns.ipr(worker.netns) as ipr:
        eth0 = ipr.get_links(ipr.link_lookup(ifname="eth0")[0])[0]
        stats = eth0.get_attr("IFLA_STATS64")
    # What the worker sent is mostly full jumbo frames (TCP control is small and rare).
    assert stats["tx_bytes"] / stats["tx_packets"] > 4000, stats
