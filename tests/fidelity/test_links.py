"""The link check on a real shaped veth: a link kept full drains what it holds at its
rate, and one that sends slower than the rate it is said to have is named."""

import threading

import pytest

from tailcut.fidelity import links, verdict
from tailcut.net import netns, shaping, tc
from tailcut.spec.model import Link
from tests import netutil
from tests.datapath.udp_link import IFNAME, RECEIVER_IP, build_link, remove_link

pytestmark = pytest.mark.netns

RATE_BIT = 20_000_000
FLOOD = """
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
# a deep socket buffer: the queue in the qdisc holds more than the link sends between
# two samples, so a link short of its rate cannot drain it (fidelity.links)
s.setsockopt(socket.SOL_SOCKET, 32, 8 << 20)   # SO_SNDBUFFORCE
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    try:
        s.sendto(b"x" * 1400, ("{ip}", 9))
    except OSError:
        time.sleep(0.0005)   # the queue is full: that is the point
"""


@pytest.fixture
def shaped_link():
    link = build_link("fid")
    try:
        with netns.ipr(link.sender) as ipr:
            tc.apply(shaping.plan(Link(bandwidth="20Mbit"), False, "f"), ipr,
                          link.sender, IFNAME)
        yield link
    finally:
        remove_link(link)


def test_a_full_link_sends_at_its_rate_and_one_said_faster_is_named(shaped_link):
    end = f"{shaped_link.sender}/{IFNAME}"
    honest = links.Sampler({end: RATE_BIT})
    # the same link, as if it had been configured at twice the rate HTB holds it to:
    # a link that could not send at its rate
    slow = links.Sampler({end: 2 * RATE_BIT})
    flood = netutil.start(shaped_link.sender, FLOOD.format(seconds=2.0, ip=RECEIVER_IP))
    try:
        for sampler in (honest, slow):
            sampler.start()
        threading.Event().wait(1.8)
    finally:
        got = {"honest": honest.stop(), "slow": slow.stop()}
        flood.kill()
        flood.wait()
    full = got["honest"]["ends"][end]
    assert full["backlogged_share"] > 0.8, got
    assert full["drain"] >= 0.95 and 0.9 <= full["busy_rate"] <= 1.1, got
    assert 0.8 <= full["utilization"] <= 1.1, got   # kept full over the window
    assert verdict.judge(links=got["honest"])["verdict"] == "network-bound"
    said = got["slow"]["ends"][end]
    assert said["drain"] < 0.6 and said["busy_rate"] < 0.6, got
    judged = verdict.judge(links=got["slow"])
    assert judged["verdict"] == "host-bound"
    assert f"link end {end} drained" in judged["reasons"][0]


def test_dump_reads_an_htb_roots_counters(shaped_link):
    from tailcut.net import rtnl
    with rtnl.socket_in(shaped_link.sender) as sock:
        index = rtnl.ifindex(sock, IFNAME)
        before = links.dump(sock)[index]
        delivered = netutil.udp_delivered(shaped_link.sender, shaped_link.receiver,
                                          RECEIVER_IP, 50)
        after = links.dump(sock)[index]
    assert delivered > 0
    # 50 datagrams of 256 bytes plus their headers went through the root
    assert after.sent_bytes - before.sent_bytes >= 50 * (256 + 42)
    assert after.waiting_bytes == 0
