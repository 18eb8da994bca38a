"""The sender's packets: header rows from the ctypes view, values taken in place."""

import errno
import os
import socket
import threading
import time

import numpy as np
import pytest

from tailcut.transports import base, sender, srpt, wire
from tailcut.transports.base import Kind

VECTOR = np.random.default_rng(3).standard_normal(1000).astype(np.float32)


def test_every_datagram_parses_back_to_its_slot_of_the_vector() -> None:
    packets = sender.Packets(VECTOR, 5, 6, int(Kind.PUSH), 360)
    assert len(packets) == 3
    packets.number(np.array([2, 0, 1]), 10, wire.F_RETX)
    got = [wire.parse(packets.datagram(slot)) for slot in range(3)]
    assert [(p.start, p.end, p.total, p.job, p.message) for p in got] == \
        [(0, 360, 1000, 5, 6), (360, 720, 1000, 5, 6), (720, 1000, 1000, 5, 6)]
    assert [p.seq for p in got] == [11, 12, 10]
    assert [p.flags for p in got] == [wire.F_RETX, wire.F_RETX | wire.F_LAST, wire.F_RETX]
    assert np.array_equal(np.concatenate([p.values for p in got]), VECTOR)


def test_pace_sends_every_slot_once_in_order_then_stops_early_when_told() -> None:
    packets = sender.Packets(VECTOR, 5, 6, int(Kind.PUSH), 100)
    out: list[bytes] = []
    order = np.array([9, 3, 0, 7, 1, 2, 4, 5, 6, 8])
    stop = threading.Event()
    sent = sender.pace(None, ("127.0.0.1", 9), packets, order, None, stop,  # type: ignore
                       None, "peer", lambda d, _a: out.append(d))
    assert sent == sender.Pass(sent=10) and \
        [wire.parse(d).start // 100 for d in out] == order.tolist()
    stop.set()
    many = np.arange(len(packets)).repeat(5)  # 50 datagrams: stops after the first burst
    assert sender.pace(None, ("127.0.0.1", 9), packets, many, None, stop,  # type: ignore
                       None, "peer", lambda d, _a: None).sent == sender.BURST_PACKETS


def test_a_pass_waits_for_its_turn_on_the_link_and_stops_there_when_done(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass behind another on its sender's link (srpt.py) sends nothing until that
    one leaves; one DONE while it waits sends nothing at all. (The wait's own timeout
    is out of the way: only the wake-ups end the waits.)"""
    monkeypatch.setattr(sender, "TURN_WAIT_S", 30.0)
    packets = sender.Packets(VECTOR, 5, 6, int(Kind.PUSH), 100)
    link = srpt.LinkSchedule(1e9)
    ahead = link.enter(10**9, lambda: None)   # 8 s of link time: the wait never runs out
    out: list[bytes] = []
    stop = threading.Event()
    result: list[sender.Pass] = []

    def behind() -> None:
        turn = link.enter(10**9, lambda: None)
        try:
            result.append(sender.pace(None, ("127.0.0.1", 9), packets,  # type: ignore
                                      np.arange(10), None, stop, None, "peer",
                                      lambda d, _a: out.append(d), turn=turn))
        finally:
            link.leave(turn)

    t = threading.Thread(target=behind, daemon=True)
    t.start()
    t.join(0.2)
    assert t.is_alive() and out == []   # waiting for the link
    link.leave(ahead)
    t.join(5)
    assert result == [sender.Pass(sent=10)]
    link.enter(10**9, lambda: None)
    t = threading.Thread(target=behind, daemon=True)
    t.start()
    t.join(0.2)
    stop.set()
    link.changed()   # what a DONE does (datagram.py)
    t.join(5)
    assert not t.is_alive() and result[-1] == sender.Pass(sent=0)


def test_the_start_credit_goes_out_at_once_but_within_half_the_switch_buffer() -> None:
    """A pass that finds its link idle sends 1 ms of link time in its first burst;
    behind a 30 KB switch buffer only an ordinary burst (0.4 ms); a pass sent next to
    another, too."""
    packets = sender.Packets(np.zeros(200 * 360, np.float32), 5, 6, int(Kind.PUSH), 360)
    frame = int(packets.lengths[0]) + wire.IP_UDP_BYTES + sender.ETH_BYTES

    def first_burst(credit_bytes: float | None, idle: bool) -> int:
        link = srpt.LinkSchedule(1e9)
        if not idle:
            link.enter(1, lambda: 1e6)   # ahead of it, granted 1 Mbit/s
        turn = link.enter(10**6, lambda: None)
        stop = threading.Event()
        sent: list[bytes] = []

        def send(d: bytes, _a: object) -> None:
            sent.append(d)
            stop.set()   # looked at after each burst: the pass ends after the first

        sender.pace(None, ("127.0.0.1", 9), packets, np.arange(len(packets)),  # type: ignore
                    None, stop, None, "peer", send, turn=turn, credit_bytes=credit_bytes)
        return len(sent)

    assert first_burst(None, True) == int(1e9 * sender.START_CREDIT_S / 8 / frame)   # 82
    burst = int(1e9 * sender.BURST_S / 8 / frame)                                    # 33
    assert first_burst(15_000, True) == burst
    assert first_burst(None, False) == int((1e9 - 1e6) * sender.BURST_S / 8 / frame)


def test_a_burst_refused_because_the_path_is_down_is_lost_and_the_pass_goes_on() -> None:
    """ENETUNREACH (the pod's link removed for a moment) loses that burst; any other
    error is still raised."""
    packets = sender.Packets(VECTOR, 5, 6, int(Kind.PUSH), 100)
    order = np.arange(len(packets)).repeat(4)    # 40 slots: 3 bursts of 16, 16 and 8
    calls = [0]

    def down_for_the_second_burst(_d: bytes, _a: object) -> None:
        calls[0] += 1
        if 16 < calls[0] <= 17:
            raise OSError(errno.ENETUNREACH, "Network is unreachable")
    outage = sender.Outage()
    outcome = sender.pace(None, ("127.0.0.1", 9), packets, order, None,  # type: ignore
                          threading.Event(), None, "peer", down_for_the_second_burst,
                          outage=outage)
    assert outcome == sender.Pass(sent=24, unsent=16)
    assert outage.since is None and outage.unsent == 16   # over: the third burst went out
    assert outage.why == os.strerror(errno.ENETUNREACH)

    def refused(_d: bytes, _a: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")   # a firewall's: policy
    with pytest.raises(OSError, match="not permitted"):
        sender.pace(None, ("127.0.0.1", 9), packets, order, None,  # type: ignore
                    threading.Event(), None, "peer", refused)


def test_a_path_down_longer_than_the_grace_is_an_error_naming_the_peer_and_why() -> None:
    outage = sender.Outage()
    outage.refused(16, errno.ENETUNREACH, 100.0, "10.1.0.2:7000")
    outage.refused(16, errno.ENETUNREACH, 100.0 + sender.PATH_DOWN_GRACE_S, "10.1.0.2:7000")
    with pytest.raises(base.TransportError, match=r"10\.1\.0\.2:7000: Network is unreachable "
                       r"for 6\d s .*node agent"):
        outage.refused(16, errno.ENETUNREACH, 101.0 + sender.PATH_DOWN_GRACE_S,
                       "10.1.0.2:7000")
    outage.cleared()   # a burst went out: the next refusal starts a new outage
    outage.refused(16, errno.ENETUNREACH, 500.0, "10.1.0.2:7000")
    assert outage.since == 500.0 and outage.unsent == 16


def _received_tos(rx: socket.socket, count: int) -> list[tuple[int, int]]:
    """(slot, TOS) of ``count`` datagrams read from ``rx`` (IP_RECVTOS on)."""
    out = []
    for _ in range(count):
        data, anc, _flags, _addr = rx.recvmsg(2048, socket.CMSG_SPACE(4))
        tos = [c[2][0] for c in anc if c[:2] == (socket.IPPROTO_IP, socket.IP_TOS)]
        out.append((wire.parse(data).start // 100, tos[0]))
    return out


@pytest.mark.parametrize("per_datagram", [False, True])
def test_each_datagram_carries_the_tos_of_its_slot_on_either_send_path(per_datagram) -> None:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind(("127.0.0.1", 0))
        rx.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        rx.settimeout(5)
        packets = sender.Packets(VECTOR, 5, 6, int(Kind.PUSH), 100)
        tos = np.array([0x20, 0x20, 0x24, 0x24, 0x24, 0x28, 0x28, 0x28, 0x28, 0])
        order = np.array([1, 0, 4, 2, 3, 8, 5, 7, 6, 9])  # cut by cut, as a tagged message
        sendto = tx.sendto if per_datagram else None
        sent = sender.pace(tx, rx.getsockname(), packets, order, None, threading.Event(),
                           None, "peer", sendto, tos)
        assert sent.sent == 10
        assert _received_tos(rx, 10) == [(int(s), int(tos[s])) for s in order]
        # The socket is left untagged for what is sent next.
        assert tx.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == 0
    finally:
        rx.close()
        tx.close()


def test_a_burst_is_a_whole_gso_message_only_with_gso_and_no_finite_switch_buffer() -> None:
    """22 full datagrams of a 1500-byte MTU fill one GSO message of the links' 32 KiB;
    a finite switch buffer (or no GSO) keeps the small bursts that a shallow one can
    hold."""
    assert sender.burst_floor(True, 1500) == 22
    assert sender.burst_floor(False, 1500) == sender.BURST_PACKETS
    assert sender.burst_floor(True, 9000) == sender.BURST_PACKETS  # 3 jumbo datagrams


def test_without_settle_the_last_burst_is_not_slept_off_but_said_when_the_link_is_idle(
        ) -> None:
    """One burst of 10 datagrams at 1 Mbit/s is 36 ms of link time (1 ms of it start
    credit): pace sleeps it off, or with settle off returns at once with when it ends."""
    packets = sender.Packets(VECTOR, 5, 6, int(Kind.PUSH), 100)
    order = np.arange(len(packets))
    link_s = 8 * int(sender.wire_bytes_before(packets, order)[-1]) / 1e6
    assert sender.wire_bytes(packets, order) == sender.wire_bytes_before(packets, order)[-1]
    for settle in (True, False):
        start = time.monotonic()
        result = sender.pace(None, ("127.0.0.1", 9), packets, order, 1e6,  # type: ignore
                             threading.Event(), None, "peer", lambda d, _a: None,
                             settle=settle)
        took = time.monotonic() - start
        idle_s = link_s - sender.START_CREDIT_S
        if settle:
            assert result.idle_at is None and took >= idle_s
        else:
            assert took < idle_s / 2 and result.idle_at is not None
            assert result.idle_at - start == pytest.approx(idle_s, abs=0.005)
