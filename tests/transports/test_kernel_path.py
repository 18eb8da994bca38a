"""bounded-loss with receive_path="kernel": the receiving role's datagrams are placed by
tailcut.datapath.rxring's tc program at its interface's ingress, not read from its
socket. Real veths in namespaces, real loss droppers, the real program."""

from typing import Any

import numpy as np
import pytest

from tailcut.spec import from_dict
from tailcut.transports import datagram
from tailcut.transports.base import Kind, Message
from tests import waiting
from tests.datapath.udp_link import IFNAME, RECEIVER_IP
from tests.transports.test_datagram import (VECTOR, assert_at_least_p,  # noqa: F401
                                            clean_link, lossy_link, pair)

pytestmark = [pytest.mark.netns, pytest.mark.bpf]


def entered(ns: str) -> Any:
    from tailcut.net import netns
    return lambda: netns.entered(ns)


def filters_on(ns: str) -> list[str]:
    from tailcut.net import netns
    with netns.ipr(ns) as ipr:
        index = ipr.link_lookup(ifname=IFNAME)[0]
        return [f.get_attr("TCA_OPTIONS").get_attr("TCA_BPF_NAME") or ""
                for f in ipr.get_filters(index, parent="ffff:fff2") if f["handle"]]


def test_the_kernel_places_every_message_bit_exact_and_the_socket_reads_none(
        clean_link: Any) -> None:
    """p = 1 on a clean veth, both ways: each message whole and bit-exact, each data
    datagram taken once (by the program, or the socket before the message's BEGIN was
    read), one region per message released at completion; close() takes the filter
    away."""
    with pair("bounded-loss", 27310, entered(clean_link.receiver),
              entered(clean_link.sender), host=RECEIVER_IP, p=1.0, job="bl-kpath",
              gso=True, receive_path="kernel") as (server, s, client, c):
        assert server.counter is None and server.ring is not None
        assert filters_on(clean_link.receiver) == ["tailcut_rxring"]
        for i in range(8):
            c.send(Message(Kind.PUSH, i, 1, VECTOR), 20)
            msg = s.recv(20)
            assert msg.mask is None and np.array_equal(msg.values, VECTOR)
            s.send(Message(Kind.PARAMS, i, -1, VECTOR * 2), 20)
            back = c.recv(20)
            assert back.mask is None and np.array_equal(back.values, VECTOR * 2)
        # Every datagram taken once: by the program once its message is bound (at
        # BEGIN), by the socket before (a BEGIN the control reader had not read yet).
        packets = 8 * -(-VECTOR.size // server.stride)
        assert server.stats["kernel_placed"] + server.stats["accepted"] == packets
        assert server.stats["kernel_placed"] >= packets // 2, server.stats
        assert [r["reason"] for r in server.completions] == ["full"] * 8
        # Each message's region lingers a moment (its late datagrams end there), then
        # goes; one stays bound ahead, for the peer's next message.
        assert server.stats["kernel_bound_ahead"] >= 6, server.stats
        assert waiting.until(lambda: len(server.ring.bound()) == 1, 2), server.ring.bound()
        last = server.completions[-1]["message"]
        assert server.ring.bound() == [last + 1]
    assert filters_on(clean_link.receiver) == []


def test_at_p_below_one_over_a_lossy_veth_each_message_has_p_and_only_true_values(
        lossy_link: Any) -> None:
    """10% loss each way, p = 0.8: completed at p from the kernel's event or after a
    repair round (a NACK naming the ranges the region lacks); what is marked delivered
    is the sender's value."""
    with pair("bounded-loss", 27320, entered(lossy_link.receiver),
              entered(lossy_link.sender), host=RECEIVER_IP, p=0.8, job="bl-kloss",
              rate_bit=500e6, receive_path="kernel") as (server, s, client, c):
        for i in range(10):
            c.send(Message(Kind.PUSH, i, 1, VECTOR), 20)
            msg = s.recv(20)
            ok = assert_at_least_p(msg, VECTOR, 0.8)
            assert not msg.values[~ok].any(), "a value not delivered is not zero"
        assert server.stats["kernel_placed"] > 0, server.stats


def test_a_message_that_finds_no_free_region_comes_through_the_socket(
        clean_link: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """One region: while it is bound, a second message at once is received as before."""
    monkeypatch.setattr(datagram, "KERNEL_REGIONS", 1)
    with pair("bounded-loss", 27330, entered(clean_link.receiver),
              entered(clean_link.sender), host=RECEIVER_IP, p=1.0, job="bl-kfull",
              gso=True, receive_path="kernel") as (server, s, client, c):
        with server._lock:   # (as the control reader begins a message)
            server._recv.begin(c_peer(server), 0, (1 << 16) | 0xFFF0, Kind.PUSH, 0, 1, 64,
                               0)
        for i in range(3):   # the one region is held by the message begun above
            c.send(Message(Kind.PUSH, i, 1, VECTOR), 20)
            assert np.array_equal(s.recv(20).values, VECTOR)
        assert server.stats["kernel_regions_full"] == 3
        assert server.stats["accepted"] >= 3 * -(-VECTOR.size // server.stride)


def test_a_message_not_as_its_peers_last_is_received_whole_all_the_same(
        clean_link: Any) -> None:
    """The region bound ahead guesses the next message is as the last (size, kind): one
    of another size has its datagrams left to the socket until its BEGIN binds it
    anew."""
    with pair("bounded-loss", 27340, entered(clean_link.receiver),
              entered(clean_link.sender), host=RECEIVER_IP, p=1.0, job="bl-kguess",
              gso=True, receive_path="kernel") as (server, s, client, c):
        for i, vector in enumerate([VECTOR, VECTOR, VECTOR[:7000], VECTOR, VECTOR[:10]]):
            c.send(Message(Kind.PUSH, i, 1, vector), 20)
            got = s.recv(20)
            assert got.mask is None and np.array_equal(got.values, vector), i
        # Only the second message was as the one before it; the others' guesses were
        # released at their BEGINs (their early datagrams, if any, went to the socket,
        # counted total_mismatch).
        assert server.stats["kernel_bound_ahead"] == 1, server.stats


def test_hostile_datagrams_at_the_receiver_change_no_message_and_stop_nothing(
        clean_link: Any) -> None:
    """Between real messages, datagrams that claim the next message with another total
    or kind (passed to the socket, whose checks refuse them), ranges past its end,
    cut ones, another job's and garbage: every real message still arrives bit-exact."""
    from tailcut.transports import wire
    rng = np.random.default_rng(7)
    with pair("bounded-loss", 27350, entered(clean_link.receiver),
              entered(clean_link.sender), host=RECEIVER_IP, p=1.0, job="bl-khostile",
              gso=True, receive_path="kernel") as (server, s, client, c):
        to = server._udp.getsockname()
        for i in range(6):
            c.send(Message(Kind.PUSH, i, 1, VECTOR), 20)
            assert np.array_equal(s.recv(20).values, VECTOR), i
            following = server.completions[-1]["message"] + 1   # bound ahead
            good = dict(job=server.job_id, message=following, seq=0, start=0,
                        values=VECTOR[:server.stride])
            for bad in (wire.build(**{**good, "total": VECTOR.size + 1}),
                        wire.build(**{**good, "total": VECTOR.size}, kind=3),
                        wire.build(**{**good, "total": VECTOR.size, "start": VECTOR.size}),
                        wire.build(**{**good, "total": VECTOR.size})[:-3],
                        wire.build(**{**good, "total": VECTOR.size, "job": 1}),
                        rng.bytes(200)):
                client._udp.sendto(bad, to)
        assert server.ring.stats()["kind_mismatch"] + server.ring.stats()[
            "total_mismatch"] >= 6
        assert server.stats["bad_packet"] + server.stats["mismatch"] + \
            server.stats["unknown_message"] > 0, server.stats


def c_peer(server: Any) -> Any:
    [(conn, _)] = server._recv.peers.values()
    return conn


@pytest.mark.parametrize("field, value, says", [
    ("type", "udp", "receivePath: only bounded-loss receive in the kernel"),
    ("minP", 0.5, "minP: early close watches each packet's arrival"),
])
def test_the_spec_refuses_the_kernel_path_where_it_does_not_apply(field: str, value: Any,
                                                                   says: str) -> None:
    transport = {"type": "bounded-loss", "p": 0.9, "receivePath": "kernel", field: value}
    if transport["type"] == "udp":
        del transport["p"]
    with pytest.raises(Exception, match=says):
        from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                   "metadata": {"name": "k"}, "spec": {"transport": transport}})


def test_a_range_that_came_both_ways_counts_once_and_p_is_judged_on_the_union() -> None:
    """Part of a message through the socket before its region was bound, the rest
    placed by the program, some ranges both ways (a GSO skb passed whole, a duplicate
    either side of the bind): the receiver counts each range once, lowers the region's
    threshold by the socket's own share, and hands over exactly the union."""
    import collections
    from types import SimpleNamespace

    from tailcut.datapath import bpfsys, rxring
    from tailcut.transports import batch, receiver, wire
    from tests.datapath.frames import udp_frame
    stride, job, port, message = 360, wire.job_id("bl-both"), 7600, (3 << 16) | 5
    values = np.random.default_rng(3).standard_normal(3600).astype(np.float32)  # 10 ranges
    ring = rxring.load(port=port, job=job, stride=stride, ranges=64, regions=2)
    try:
        stats: collections.Counter[str] = collections.Counter()
        recv = receiver.Receiver(job, stride, 0.8, True, False, 1 << 20, stats)
        recv.ring = ring
        peer = SimpleNamespace(peer_id=3, udp_addr=("10.99.0.1", 40000))
        source = batch.ipv4("10.99.0.1")
        datagrams = list(wire.packets(values, job=job, message=message, stride=stride))
        done: list[receiver.Done] = []
        recv.begin(peer, source, message, int(Kind.PUSH), 0, 1, values.size, 0)
        rx = recv.rx[message]
        assert rx.kernel is not None
        # ranges 0-3 through the socket, 2-5 placed by the program (2 and 3 both ways)
        rows = np.zeros((4, recv.row_bytes), np.uint8)
        for i, d in enumerate(datagrams[:4]):
            rows[i, :len(d)] = np.frombuffer(d, np.uint8)
        recv.accept(rows, np.array([len(d) for d in datagrams[:4]]),
                    np.full(4, source), done)
        for d in datagrams[2:6]:
            assert bpfsys.test_run(ring.program.fds[rxring.FUNCTION],
                                   udp_frame(d, port, src="10.99.0.1"))[0] != 0xFFFFFFFF
        assert recv.counted(rx) == 6 * stride, "ranges 2 and 3 counted twice"
        # The region fired at 4 ranges (its threshold lowered by the socket's 4 when
        # they were read); p = 0.8 is 8 ranges, of which the socket's own are 2 (0, 1).
        [event] = ring.consume()
        recv.kernel_event(event.message, event.ktime_ns, event.at_p, done)
        assert not done
        assert int(ring.state["threshold"][rx.kernel.region]) == 6 * stride
        for d in datagrams[6:8]:
            bpfsys.test_run(ring.program.fds[rxring.FUNCTION],
                            udp_frame(d, port, src="10.99.0.1"))
        [event] = ring.consume()   # at the region's 6 ranges: it fires again
        recv.kernel_event(event.message, event.ktime_ns, event.at_p, done)
        [finished] = done
        assert finished.reason == "p" and rx.count == 8 * stride
        assert np.array_equal(rx.values[rx.mask], values[:8 * stride])
        assert not rx.mask[8 * stride:].any()
    finally:
        ring.detach()
