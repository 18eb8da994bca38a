"""Receiver-driven rates: equal shares of what the receiver's link has left, grants
sent only when they change, and the other traffic on a link read from its byte
counter. (A sender's own link: test_srpt.py.)"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tailcut.transports import congestion

GBIT = 1e9


@dataclass
class Msg:
    granted_kbit: int = 0


def test_each_message_converging_on_a_receiver_gets_an_equal_share_of_its_link() -> None:
    active = [Msg(), Msg(), Msg(), Msg()]
    grants = congestion.shares(GBIT, active)
    assert [kbit for _, kbit in grants] == [250_000] * 4
    assert all(m.granted_kbit == 250_000 for m in active)


def test_a_share_is_granted_again_only_when_it_moves_by_more_than_two_percent() -> None:
    active = [Msg(), Msg()]
    congestion.shares(GBIT, active)
    assert congestion.shares(GBIT * 1.01, active) == []          # 1% more: kept
    assert len(congestion.shares(GBIT * 1.1, active)) == 2       # 10% more: sent
    assert congestion.shares(GBIT, active[:1])[0][1] == 1_000_000  # alone: the whole link


def test_an_unshaped_link_grants_nothing() -> None:
    assert congestion.shares(None, [Msg()]) == []
    assert congestion.shares(GBIT, []) == []


def _dev(path: Path, eth0_rx_bytes: int) -> None:
    path.write_text(
        "Inter-|   Receive                                                |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes ...\n"
        f"    lo:  999 1 0 0 0 0 0 0 999 1 0 0 0 0 0 0\n"
        f"  eth0: {eth0_rx_bytes} 10 0 0 0 0 0 0 5 1 0 0 0 0 0 0\n")


def test_the_monitor_counts_what_arrived_on_the_link_that_was_not_ours(tmp_path) -> None:
    dev = tmp_path / "dev"
    _dev(dev, 1_000_000)
    mon = congestion.LinkMonitor("eth0", str(dev))
    assert mon.sample(0.0) == 0.0
    # 100 ms later: 2.5 MB more arrived, 1.25 MB of it our datagrams (with headers).
    _dev(dev, 3_500_000)
    mon.ours(1_250_000 - 1000 * congestion.WIRE_OVERHEAD_BYTES, 1000)
    other = mon.sample(0.1)
    assert other == pytest.approx(8 * 1_250_000 / 0.1)   # 100 Mbit/s of others
    assert congestion.pool(GBIT, other, 4) == pytest.approx(GBIT - 1e8)


def test_the_job_keeps_a_flow_s_fair_share_when_others_fill_the_link() -> None:
    """The other traffic counts as one more flow: one message next to it gets half
    the link, four get 4/5, however much the others send."""
    assert congestion.pool(GBIT, 5 * GBIT, 1) == pytest.approx(GBIT / 2)
    assert congestion.pool(GBIT, 0.5 * GBIT, 4) == pytest.approx(0.8 * GBIT)
    # What the others leave beyond that is the job's too.
    assert congestion.pool(GBIT, 0.1 * GBIT, 1) == pytest.approx(0.9 * GBIT)
    assert congestion.pool(None, 0.0, 1) is None


def test_other_traffic_within_the_estimate_s_noise_leaves_the_whole_link() -> None:
    assert congestion.pool(GBIT, 0.03 * GBIT, 1) == GBIT
    assert congestion.pool(GBIT, 0.06 * GBIT, 1) == pytest.approx(0.94 * GBIT)


def test_an_unreadable_counter_reports_nothing(tmp_path) -> None:
    assert congestion.LinkMonitor("eth0", str(tmp_path / "missing")).sample(0.0) is None
    dev = tmp_path / "dev"
    _dev(dev, 1)
    assert congestion.LinkMonitor("tc0", str(dev)).sample(0.0) is None


def test_datagrams_not_read_yet_at_a_sample_do_not_count_as_other_traffic(tmp_path) -> None:
    """The counter runs ahead of the socket: 1000 of our datagrams counted by the
    interface at one sample are read only before the next. Nothing else arrived, so
    the smoothed other traffic must come back to 0, not stay at the first sample's."""
    dev = tmp_path / "dev"
    _dev(dev, 0)
    mon = congestion.LinkMonitor("eth0", str(dev))
    mon.sample(0.0)
    size = 1500
    _dev(dev, 1000 * size)                    # in the interface, not read yet
    assert mon.sample(0.005) > 0
    mon.ours(1000 * (size - congestion.WIRE_OVERHEAD_BYTES), 1000)
    assert mon.sample(0.010) == pytest.approx(0.0, abs=1.0)


@pytest.mark.netns
def test_our_datagrams_count_as_the_receiving_interface_counted_them() -> None:
    """Across a real veth, 100 datagrams sent as UDP GSO messages reach the socket
    whole (5 of them: at most 22 datagrams each, batch.MAX_GSO_PAYLOAD): the
    interface counts one set of headers per message, and so
    must `ours`, or our own traffic is overstated (by 2.8% with a set per datagram)
    and the others' understated."""
    import socket
    import time

    from tailcut.net import netns
    from tailcut.transports import batch
    from tests.datapath.udp_link import IFNAME, RECEIVER_IP, SENDER_IP, build_link, remove_link
    link = build_link("mon")
    try:
        with netns.entered(link.receiver):
            rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            rx.bind((RECEIVER_IP, 7100))
            inbox = batch.GroInbox(rx, 64, 1448)
            mon = congestion.LinkMonitor(IFNAME)
            before = mon._read()
        with netns.entered(link.sender):
            tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            tx.bind((SENDER_IP, 0))
        data = np.zeros(100 * 1448, np.uint8)
        lengths = np.array([1448] * 99 + [500])
        batch.Batch(tx, [batch.Piece(data, np.arange(100) * 1448, lengths)],
                    (RECEIVER_IP, 7100), gso_size=1448).send(0, 100)
        time.sleep(0.1)
        n = inbox.recv()
        assert n == 100 and inbox.packets == 5
        mon.ours(int(inbox.lengths(n).sum()), inbox.packets)
        with netns.entered(link.receiver):
            after = mon._read()
        assert before is not None and after is not None
        assert mon._ours == after - before
        rx.close()
        tx.close()
    finally:
        remove_link(link)
