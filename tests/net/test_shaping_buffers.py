"""Switch buffers on a real veth: a burst larger than a link's buffer loses what does
not fit, and the queue's drop counter accounts for every datagram that did not
arrive. The link is quiet (tests/datapath/udp_link.py: no IPv6, static neighbours),
so the counts compare exactly."""

import time

import pytest

from tailcut.net import netns, shaping, tc
from tailcut.spec.model import Link
from tests import netutil
from tests.datapath.udp_link import IFNAME, RECEIVER_IP, build_link, remove_link

pytestmark = pytest.mark.netns

DATAGRAM_BYTES = 1000
# HTB lets a class send its bucket at once (shaping.Htb.burst_bytes: one GSO packet
# and a frame, ~34 kB); what comes faster than that waits in the queue. 300 datagrams
# of 1000 bytes are ~310 kB: ~270 must wait, more than a buffer of 8 holds and fewer
# than the kernel's default queue of 1000.
BURST = 300


@pytest.fixture
def quiet_link():
    made = []

    def make(tag):
        made.append(build_link(tag))
        return made[-1]

    yield make
    for link in made:
        remove_link(link)


def shape(ns, link, levels=0):
    """The sender's egress shaped as `link`, with `levels` CadentFlow classes."""
    with netns.ipr(ns) as ipr:
        tc.apply(shaping.plan(link, False, "f"), ipr, ns, IFNAME)
        if levels:
            tc.apply_priorities(shaping.plan_priorities(
                link.bandwidth, levels, queue=shaping.buffer(link)), ipr, IFNAME)


def burst(link, count=BURST, priority=0):
    return netutil.udp_burst_received(link.sender, link.receiver, RECEIVER_IP, count,
                                      DATAGRAM_BYTES, priority)


def drops(ns):
    with netns.ipr(ns) as ipr:
        return tc.queue_drops(ipr, IFNAME)


def leaves(ns):
    """(kind, parent, limit) of every qdisc under the root."""
    with netns.ipr(ns) as ipr:
        index = ipr.link_lookup(ifname=IFNAME)[0]
        return sorted((q.get_attr("TCA_KIND"), q["parent"], q.get_attr("TCA_OPTIONS")["limit"])
                      for q in ipr.get_qdiscs(index=index)
                      if q.get_attr("TCA_KIND") in ("pfifo", "bfifo"))


def drops_by_class(ns):
    """Drops of each pfifo/bfifo leaf, by the class it hangs under."""
    with netns.ipr(ns) as ipr:
        index = ipr.link_lookup(ifname=IFNAME)[0]
        return {q["parent"]: q.get_attr("TCA_STATS2").get_attr("TCA_STATS_QUEUE")["drops"]
                for q in ipr.get_qdiscs(index=index)
                if q.get_attr("TCA_KIND") in ("pfifo", "bfifo")}


def test_a_burst_past_an_8_packet_buffer_loses_exactly_what_the_queue_counts(quiet_link):
    link = quiet_link("bq8")
    shape(link.sender, Link(bandwidth="10Mbit", buffer_packets=8))
    assert leaves(link.sender) == [("pfifo", shaping.DEFAULT_CLASS, 8)]
    got = burst(link)
    lost, counted = BURST - got, drops(link.sender)
    print(f"{got} of {BURST} arrived; the queue counted {counted} drops")
    assert lost >= 150           # most of what HTB's bucket did not pass at once
    assert counted == lost


def test_without_a_buffer_the_same_burst_fits_the_default_queue(quiet_link):
    link = quiet_link("bqd")
    shape(link.sender, Link(bandwidth="10Mbit"))
    assert leaves(link.sender) == []     # the kernel's default pfifo, 1000 packets
    assert burst(link) == BURST
    assert drops(link.sender) == 0


def test_the_kernels_default_queue_overflows_too_and_its_drops_are_counted(quiet_link):
    link = quiet_link("bqo")
    shape(link.sender, Link(bandwidth="10Mbit"))
    got = burst(link, count=1300)        # past its 1000 packets (txqueuelen)
    assert 1300 - got >= 150 and drops(link.sender) == 1300 - got


def test_a_byte_buffer_holds_as_many_datagrams_as_fit_and_counts_the_rest(quiet_link):
    link = quiet_link("bqb")
    shape(link.sender, Link(bandwidth="10Mbit", buffer_bytes=10_000))
    assert leaves(link.sender) == [("bfifo", shaping.DEFAULT_CLASS, 10_000)]
    got = burst(link)
    assert BURST - got >= 150 and drops(link.sender) == BURST - got


def test_each_priority_class_has_its_own_buffer_and_its_drops_are_counted(quiet_link):
    link = quiet_link("bqp")
    shape(link.sender, Link(bandwidth="10Mbit", buffer_packets=8), levels=2)
    # Replacing 1:10 with its new rate kept its queue; each level got its own.
    assert leaves(link.sender) == [("pfifo", shaping.DEFAULT_CLASS, 8), ("pfifo", 0x10020, 8),
                                   ("pfifo", 0x10021, 8)]
    got = burst(link, priority=0x10021)    # level 1, past its own 8 packets
    assert BURST - got >= 150 and drops(link.sender) == BURST - got
    assert drops_by_class(link.sender) == {shaping.DEFAULT_CLASS: 0, 0x10020: 0,
                                           0x10021: BURST - got}
    time.sleep(0.5)   # let the link's bucket fill again
    again = burst(link)                   # untagged: the default class's queue
    assert BURST - again >= 150
    assert drops(link.sender) == 2 * BURST - got - again   # both leaves' drops
