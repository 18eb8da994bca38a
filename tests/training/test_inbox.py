"""Tests of the receiving queue: arrival stamps and the fifo / shortest-transfer-first policies."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tailcut import transports
from tailcut.training import inbox
from tailcut.transports import base, tcp
from tailcut.transports.base import Kind, Message
from tests import waiting
from tests.training import loopback


def _pair_of_connections() -> tuple[list[base.Connection], list[base.Connection]]:
    """Two client connections and their server ends, over real TCP on loopback."""
    port = loopback.free_ports(1)[0]
    transport = tcp.TcpTransport()
    servers: list[base.Connection] = []
    t = threading.Thread(target=lambda: servers.extend(
        transport.listen("127.0.0.1", port, 2, timeout_s=10)))
    t.start()
    clients = [transport.connect("127.0.0.1", port, timeout_s=10) for _ in range(2)]
    t.join()
    # listen() returns in accept order, which need not be connect order: pair them up
    clients[0].send(Message(Kind.HELLO, 0, 0))
    clients[1].send(Message(Kind.HELLO, 0, 1))
    hellos = [s.recv(5) for s in servers]
    servers = [servers[[h.sender for h in hellos].index(i)] for i in range(2)]
    return clients, servers


def _until_queued(box: inbox.Inbox, count: int) -> None:
    """Wait until the reader threads have queued `count` events (none taken yet)."""
    assert waiting.until(lambda: box._queue.qsize() >= count, within_s=10, every_s=0.01), \
        f"{box._queue.qsize()} of {count} events queued"


@pytest.mark.parametrize(("ordering", "first_kind"), [("fifo", Kind.PUSH), ("stf", Kind.PULL)])
def test_the_ordering_policy_picks_which_waiting_message_is_taken_first(
    ordering: str, first_kind: Kind
) -> None:
    clients, servers = _pair_of_connections()
    try:
        box = inbox.Inbox(servers, ordering)
        big = Message(Kind.PUSH, 0, 0, np.ones(200_000, dtype=np.float32))
        clients[0].send(big)
        _until_queued(box, 1)  # the big one is complete in the queue before the small one starts
        clients[1].send(Message(Kind.PULL, 1, 1))
        _until_queued(box, 2)
        first, second = box.take(5), box.take(5)
        assert first.msg is not None and second.msg is not None
        assert first.msg.kind == first_kind and second.msg.kind != first_kind
        assert first.arrived_ns > 0 and first.msg.wire_bytes in (28, 28 + 800_000)
    finally:
        for c in clients + servers:
            c.close()


def test_a_closed_connection_becomes_one_error_event_and_take_times_out_after() -> None:
    clients, servers = _pair_of_connections()
    try:
        box = inbox.Inbox(servers[1:])
        clients[1].close()
        ev = box.take(5)
        assert ev.msg is None and isinstance(ev.error, base.PeerClosed)
        with pytest.raises(base.TransportTimeout):
            box.take(0.2)
    finally:
        for c in clients + servers:
            c.close()


def test_take_with_a_match_leaves_other_messages_queued() -> None:
    clients, servers = _pair_of_connections()
    try:
        box = inbox.Inbox(servers)
        clients[0].send(Message(Kind.PULL, 7, 0))
        clients[1].send(Message(Kind.PULL, 8, 1))
        ev = box.take(5, match=lambda e: e.source == 1)
        assert ev.msg is not None and ev.msg.iteration == 8
        ev = box.take(5)
        assert ev.msg is not None and ev.msg.iteration == 7
    finally:
        for c in clients + servers:
            c.close()


def test_an_unknown_ordering_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="ordering='lifo': supported: fifo, stf"):
        inbox.Inbox([], "lifo")


def test_datagram_connections_hand_over_what_they_receive_without_reader_threads() -> None:
    """Bounded-loss connections put what they receive in the Inbox themselves: what
    came before the Inbox first, in order; a STOP ends it, and what follows waits for
    the connection's own recv; a closed peer is one error event."""
    port = loopback.free_ports(1)[0]
    server = transports.get("bounded-loss", p=1.0, xdp=False, job="inbox-attach")
    clients = [transports.get("bounded-loss", p=1.0, xdp=False, job="inbox-attach")
               for _ in range(2)]
    got: list[base.Connection] = []
    t = threading.Thread(target=lambda: got.extend(server.listen("127.0.0.1", port, 2, 10)))
    t.start()
    peers = [c.connect("127.0.0.1", port, 10) for c in clients]
    t.join()
    try:
        peers[0].send(Message(Kind.HELLO, 0, 0))
        peers[1].send(Message(Kind.HELLO, 0, 1))
        first = [conn.recv(5) for conn in got]
        conns = [got[[m.sender for m in first].index(i)] for i in range(2)]
        vector = np.arange(5000, dtype=np.float32)
        peers[0].send(Message(Kind.PUSH, 1, 0, vector))
        assert waiting.until(lambda: conns[0].inbox.qsize() == 1, within_s=10, every_s=0.01)
        threads = {t.name for t in threading.enumerate()}
        box = inbox.Inbox(conns)
        assert {t.name for t in threading.enumerate()} - threads == set()   # no inbox-<i>
        peers[0].send(Message(Kind.PULL, 2, 0))
        peers[0].send(Message(Kind.STOP, 3, 0))
        peers[0].send(Message(Kind.PULL, 4, 0))   # after the STOP: for recv
        taken = [box.take(5) for _ in range(3)]
        assert [e.msg.kind for e in taken if e.msg] == [Kind.PUSH, Kind.PULL, Kind.STOP]
        assert np.array_equal(taken[0].msg.values, vector) and taken[0].source == 0
        assert conns[0].recv(5).iteration == 4
        peers[1].close()
        ev = box.take(5)
        assert ev.source == 1 and ev.msg is None and isinstance(ev.error, base.PeerClosed)
        with pytest.raises(base.PeerClosed):   # and the connection's recv says so too
            conns[1].recv(1)
        with pytest.raises(base.TransportTimeout):
            box.take(0.2)
        [record] = server.completions   # the PUSH's, stamped as it was handed over
        assert record["app_ns"] >= record["done_ns"]
    finally:
        for c in clients:
            c.close()
        server.close()
