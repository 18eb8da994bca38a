"""The DSCP classifier on a shaped veth: tagged flows really get their class's share."""

import os
import socket
import threading
import time

import pytest

from tailcut.datapath import classifier
from tailcut.net import netns, shaping, tc
from tailcut.spec.model import Link
from tests.datapath import udp_link

pytestmark = [pytest.mark.netns, pytest.mark.bpf]
if os.geteuid() != 0:
    pytest.skip("needs root", allow_module_level=True)

RATE = "100Mbit"
SECONDS = 2.0


def _goodputs_mbit(link: udp_link.Link, levels: list, base_port: int) -> list[float]:
    """Run one bulk TCP flow per entry of `levels` (its priority level or None for
    untagged) for SECONDS at once; return each receiver's goodput."""
    results = [0.0] * len(levels)
    servers = []
    for i in range(len(levels)):
        with netns.entered(link.receiver):
            srv = socket.socket()
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.bind((udp_link.RECEIVER_IP, base_port + i))
            srv.listen(1)
            srv.settimeout(5)
        servers.append(srv)

    def receive(i: int) -> None:
        conn, _ = servers[i].accept()
        total, start = 0, time.monotonic()
        while data := conn.recv(1 << 20):
            total += len(data)
        results[i] = total * 8 / (time.monotonic() - start) / 1e6
        conn.close()

    def send(i: int) -> None:
        with netns.entered(link.sender):
            s = socket.socket()
        if levels[i] is not None:
            s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, classifier.tos_of(levels[i]))
        s.connect((udp_link.RECEIVER_IP, base_port + i))
        buf, end = bytes(1 << 16), time.monotonic() + SECONDS
        while time.monotonic() < end:
            s.sendall(buf)
        s.close()

    threads = [threading.Thread(target=f, args=(i,)) for i in range(len(levels))
               for f in (receive, send)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=SECONDS + 10)
    for srv in servers:
        srv.close()
    return results


@pytest.fixture
def shaped_link():
    link = udp_link.build_link("cls")
    try:
        with netns.ipr(link.sender) as ipr:
            tc.apply(shaping.plan(Link(bandwidth=RATE), False, "test"), ipr,
                          link.sender, udp_link.IFNAME)
            tc.apply_priorities(shaping.plan_priorities(100_000_000, 2), ipr,
                                     udp_link.IFNAME)
        yield link
    finally:
        udp_link.remove_link(link)


def test_high_priority_flow_takes_most_of_the_link_from_a_competing_low_one(shaped_link):
    with classifier.attach(shaped_link.sender, udp_link.IFNAME) as c:
        high, low = _goodputs_mbit(shaped_link, [0, 1], 46100)
        counts = c.counts()
    assert high > 0.8 * (high + low), (high, low)
    assert counts[0][0] > 0 and counts[1][0] > 0


def test_swapping_the_tags_swaps_which_flow_wins(shaped_link):
    # The same two senders, started in the same order: only the tag decides. (Without
    # the classifier two bulk flows in one FIFO class need not split the link evenly,
    # so "fair" is not a stable control; the swap is.)
    with classifier.attach(shaped_link.sender, udp_link.IFNAME):
        first_high = _goodputs_mbit(shaped_link, [0, 1], 46200)
        first_low = _goodputs_mbit(shaped_link, [1, 0], 46300)
    assert first_high[0] > 0.8 * sum(first_high), first_high
    assert first_low[1] > 0.8 * sum(first_low), first_low


def test_untagged_packets_are_counted_as_default_and_keep_their_class(shaped_link):
    with classifier.attach(shaped_link.sender, udp_link.IFNAME) as c:
        udp_link.send_udp(shaped_link, 50)
        counts = c.counts()
    assert counts[None][0] >= 50
    assert all(counts[level][0] == 0 for level in range(classifier.LEVELS))


def test_detach_removes_the_filter_and_the_clsact_it_added(shaped_link):
    c = classifier.attach(shaped_link.sender, udp_link.IFNAME)
    c.detach()
    c.detach()  # harmless twice
    with netns.ipr(shaped_link.sender) as ipr:
        index = ipr.link_lookup(ifname=udp_link.IFNAME)[0]
        kinds = [q.get_attr("TCA_KIND") for q in ipr.get_qdiscs(index)]
    assert "clsact" not in kinds


def test_a_bad_level_is_refused_by_name():
    with pytest.raises(ValueError, match="priority level 9"):
        classifier.tos_of(9)
