"""sendmmsg and recvmmsg batches: every datagram goes out whole, in the given order, once,
and comes back with its real length, source and arrival time."""

import socket
import time

import numpy as np
import pytest

from tailcut.transports import batch


def test_a_batch_sends_the_chosen_rows_in_order_with_their_lengths(
        sockets: tuple[socket.socket, socket.socket]) -> None:
    rx, tx = sockets
    raw = np.arange(10 * 64, dtype=np.uint8).reshape(10, 64)
    lengths = np.array([64, 10, 20, 30, 40, 50, 60, 1, 2, 3])
    order = np.array([7, 2, 9, 0, 5])
    b = batch.Batch(tx, [batch.Piece(raw, order * 64, lengths[order])], rx.getsockname())
    b.send(0, 2)
    b.send(2, 3)
    got = [rx.recv(100) for _ in range(5)]
    assert got == [bytes(raw[r, :lengths[r]]) for r in order]


def test_a_datagram_is_gathered_from_its_pieces_in_place(
        sockets: tuple[socket.socket, socket.socket]) -> None:
    """A header row and a range of a separate vector make one datagram."""
    rx, tx = sockets
    heads = np.arange(3 * 4, dtype=np.uint8).reshape(3, 4)
    values = np.arange(10, dtype=np.float32)
    starts, ends = np.array([0, 4, 8]), np.array([4, 8, 10])
    order = np.array([2, 0])
    b = batch.Batch(tx, [batch.Piece(heads, order * 4, np.full(2, 4)),
                         batch.Piece(values, starts[order] * 4, (ends - starts)[order] * 4)],
                    rx.getsockname())
    b.send(0, 2)
    assert [rx.recv(100) for _ in range(2)] == \
        [heads[r].tobytes() + values[starts[r]:ends[r]].tobytes() for r in order]


def test_a_piece_reaching_outside_its_array_is_refused() -> None:
    with pytest.raises(ValueError, match="outside its array"):
        batch.Piece(np.zeros(10, np.uint8), np.array([8]), np.array([4]))


def test_the_inbox_reads_many_datagrams_with_length_source_and_arrival(
        sockets: tuple[socket.socket, socket.socket]) -> None:
    rx, tx = sockets
    rx.setsockopt(socket.SOL_SOCKET, batch.SO_TIMESTAMPNS, 1)
    inbox = batch.Inbox(rx, 8, 16)
    assert inbox.recv() == 0  # nothing waiting: no blocking
    before = time.time_ns()
    sent = [bytes([i]) * (i * 5 + 1) for i in range(5)]  # the last two are longer than 16
    for d in sent:
        tx.sendto(d, rx.getsockname())
    time.sleep(0.05)
    n = inbox.recv()
    assert n == 5
    assert inbox.lengths(n).tolist() == [len(d) for d in sent]
    for i, d in enumerate(sent):
        assert bytes(inbox.data[i, :min(len(d), 16)]) == d[:16]
    assert inbox.sources(n).tolist() == [batch.ipv4("127.0.0.1")] * 5
    arrival = inbox.arrival_ns(n - 1)
    assert arrival is not None and before <= arrival <= time.time_ns()
    assert inbox.recv() == 0


def test_more_datagrams_than_the_inbox_holds_take_several_reads(
        sockets: tuple[socket.socket, socket.socket]) -> None:
    rx, tx = sockets
    inbox = batch.Inbox(rx, 4, 8)
    for i in range(10):
        tx.sendto(bytes([i]), rx.getsockname())
    time.sleep(0.05)
    got = []
    while (n := inbox.recv()):
        got += inbox.data[:n, 0].tolist()
    assert got == list(range(10))


def test_sendmmsg_and_recvmmsg_are_found_in_libc() -> None:
    assert batch.available()


UDP_GRO = 104  # <linux/udp.h>: hand a receiver GSO messages whole (to see the grouping)


def _gso_batch(tx: socket.socket, addr: tuple[str, int], lengths: np.ndarray,
               tos: np.ndarray | None = None) -> tuple[batch.Batch, np.ndarray]:
    raw = (np.arange(len(lengths) * 64) % 251).astype(np.uint8).reshape(len(lengths), 64)
    rows = np.arange(len(lengths))
    return batch.Batch(tx, [batch.Piece(raw, rows * 64, lengths)], addr, tos,
                       gso_size=int(lengths.max())), raw


def test_with_gso_every_datagram_still_arrives_whole_and_in_order(
        sockets: tuple[socket.socket, socket.socket]) -> None:
    """Full-size runs, a short datagram in the middle, a TOS change: the kernel cuts
    each GSO message back into exactly the datagrams given."""
    rx, tx = sockets
    lengths = np.array([64, 64, 64, 20, 64, 64, 64, 64, 7])
    tos = np.array([0, 0, 0, 0, 0, 0, 0x28, 0x28, 0x28])
    b, raw = _gso_batch(tx, rx.getsockname(), lengths, tos)
    b.send(0, 5)
    b.send(5, 4)
    assert b.gso
    got = [rx.recv(100) for _ in range(len(lengths))]
    assert got == [bytes(raw[i, :lengths[i]]) for i in range(len(lengths))]


def test_gso_messages_are_runs_of_full_datagrams_cut_at_a_short_one_or_a_new_tos(
        sockets: tuple[socket.socket, socket.socket]) -> None:
    """With UDP_GRO on, the receiver sees each GSO message whole: the grouping."""
    rx, tx = sockets
    rx.setsockopt(batch.SOL_UDP, UDP_GRO, 1)
    lengths = np.array([64, 64, 64, 20, 64, 64, 64, 64, 7])
    tos = np.array([0, 0, 0, 0, 0, 0, 0x28, 0x28, 0x28])
    b, _ = _gso_batch(tx, rx.getsockname(), lengths, tos)
    b.send(0, len(lengths))
    sizes = [len(rx.recv(70_000)) for _ in range(3)]
    # [64 64 64 20] ends at the short one; [64 64] ends at the new TOS; [64 64 7].
    assert sizes == [212, 128, 135]


def test_a_gso_message_stays_under_the_32_kib_gso_packet_of_tailcuts_links(
        sockets: tuple[socket.socket, socket.socket]) -> None:
    rx, tx = sockets
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    rx.setsockopt(batch.SOL_UDP, UDP_GRO, 1)
    size = 1472
    n = 50
    payload = np.zeros(n * size, np.uint8)
    b = batch.Batch(tx, [batch.Piece(payload, np.arange(n) * size, np.full(n, size))],
                    rx.getsockname(), gso_size=size)
    b.send(0, n)
    per_message = batch.max_segments(size)
    assert per_message == 22
    sizes = [len(rx.recv(70_000)) for _ in range(3)]
    assert sizes == [per_message * size, per_message * size, (n - 2 * per_message) * size]


@pytest.mark.usefixtures("receive_path")  # rxfast.c and numpy
def test_the_gro_inbox_reads_gso_messages_whole_and_gives_one_row_per_datagram(
        sockets: tuple[socket.socket, socket.socket]) -> None:
    """Two GSO messages (cut at the row size, the last datagram short) and a single
    datagram in one read: every datagram in its own row, with its own length, and the
    source and arrival time of the message it came in."""
    rx, tx = sockets
    rx.setsockopt(socket.SOL_SOCKET, batch.SO_TIMESTAMPNS, 1)
    inbox = batch.GroInbox(rx, 8, 64)
    assert inbox.recv() == 0
    before = time.time_ns()
    lengths = np.array([64, 64, 64, 20, 64, 64, 7])
    b, raw = _gso_batch(tx, rx.getsockname(), lengths)
    b.send(0, len(lengths))  # [64 64 64 20] [64 64 7]
    tx.sendto(b"single", rx.getsockname())
    time.sleep(0.05)
    n = inbox.recv()
    assert n == len(lengths) + 1
    assert inbox.packets == 3   # as the interface counts them: one per GSO message
    assert inbox.lengths(n).tolist() == lengths.tolist() + [6]
    rows = inbox.rows(n)
    for i, length in enumerate(lengths):
        assert bytes(rows[i, :length]) == bytes(raw[i, :length])
    assert bytes(rows[-1, :6]) == b"single"
    assert inbox.sources(n).tolist() == [batch.ipv4("127.0.0.1")] * n
    arrivals = inbox.arrivals(n)
    assert (arrivals[:4] == arrivals[0]).all() and (arrivals[4:7] == arrivals[4]).all()
    assert before <= arrivals.min() and arrivals.max() <= time.time_ns()
    assert inbox.arrival_ns(n - 1) == arrivals[-1]
    assert inbox.gso_messages == 2  # read whole: the kernel did not cut them
    if inbox.addresses is not None:  # where the receiver's C takes them from
        assert inbox.addresses == (rows.ctypes.data, inbox.lengths(n).ctypes.data,
                                   inbox.sources(n).ctypes.data)
    assert inbox.recv() == 0 and inbox.misfits == 0 and inbox.packets == 0


@pytest.mark.usefixtures("receive_path")  # rxfast.c and numpy
def test_the_gro_inbox_drops_a_gso_message_cut_at_another_size_and_counts_it(
        sockets: tuple[socket.socket, socket.socket]) -> None:
    """Rows are datagrams only if the message was cut at the row size: one cut at
    another size (no sender of ours) is dropped whole, what follows it is kept."""
    rx, tx = sockets
    inbox = batch.GroInbox(rx, 8, 64)
    b, _ = _gso_batch(tx, rx.getsockname(), np.array([32, 32, 32]))
    b.send(0, 3)
    tx.sendto(b"kept", rx.getsockname())
    time.sleep(0.05)
    n = inbox.recv()
    assert n == 1 and bytes(inbox.rows(n)[0, :4]) == b"kept" and inbox.misfits == 1
    assert inbox.packets == 1


@pytest.mark.parametrize("lengths", [[64, 64, 64, 20], [64, 64], [7]])
@pytest.mark.usefixtures("receive_path")  # rxfast.c and numpy
def test_one_message_read_alone_splits_as_it_does_among_others(
        sockets: tuple[socket.socket, socket.socket], lengths: list[int]) -> None:
    """The one-message shortcut gives the rows, lengths and sources the general split
    gives the same message when another is read with it."""
    rx, tx = sockets
    inbox = batch.GroInbox(rx, 8, 64)
    b, raw = _gso_batch(tx, rx.getsockname(), np.array(lengths))
    seen = []
    for with_other in (False, True):
        b.send(0, len(lengths))
        if with_other:
            tx.sendto(b"other", rx.getsockname())
        time.sleep(0.05)
        n = inbox.recv()
        assert n == len(lengths) + with_other
        k = len(lengths)
        seen.append((inbox.lengths(n)[:k].tolist(), inbox.rows(n)[:k].tobytes(),
                     inbox.sources(n)[:k].tolist(), inbox.arrivals(n)[:k].min() > 0))
    assert seen[0] == seen[1]
    assert seen[0][0] == lengths


def test_a_full_gso_message_of_any_mtu_stays_under_what_the_links_take_whole() -> None:
    """The kernel cuts a GSO packet of gso_max_size or more (tailcut.net.shaping.GSO_BYTES)
    into single datagrams; it counts the Ethernet, IP and UDP headers too."""
    from tailcut.net import shaping
    for mtu in range(576, 9001):
        datagram = mtu - 28
        assert 14 + 28 + batch.max_segments(datagram) * datagram < shaping.GSO_BYTES, mtu
