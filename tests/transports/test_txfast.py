"""txfast.c against the numpy Batch it stands in for: for the same message, order, TOS
and GSO setting, both put the same datagrams on the wire, in the same GSO messages,
with the same TOS; indices outside the pass are refused before anything is sent."""

import errno
import os
import random
import socket
import struct
import threading
import time

import numpy as np
import pytest

from tailcut.transports import base, batch, rxfast, sender, srpt

IP_RECVTOS = 13


@pytest.fixture
def lib():
    found = rxfast.library()
    assert found is not None, rxfast.status()
    return found


def _batch(packets: sender.Packets, native: bool, sock, order, addr, tos=None, gso=False):
    """Packets.batch with the library (CompiledBatch) or as where it is not loaded
    (the numpy Batch)."""
    with pytest.MonkeyPatch.context() as mp:
        if not native:
            mp.setattr(rxfast, "library", lambda: None)
        made = packets.batch(sock, order, addr, tos, gso)
    assert isinstance(made, batch.CompiledBatch if native else batch.Batch)
    return made


def _receive(rx: socket.socket, count: int) -> list[tuple[bytes, int, int]]:
    """``count`` reads: each one's bytes, TOS and GSO cut size (0: a lone datagram)."""
    out = []
    for _ in range(count):
        data, ancillary, _, _ = rx.recvmsg(70_000, 256)
        tos = gso = 0
        for level, kind, value in ancillary:
            if level == socket.IPPROTO_IP and kind == socket.IP_TOS:
                tos = value[0]
            elif level == batch.SOL_UDP and kind == batch.UDP_GRO:
                gso = struct.unpack("i", value[:4])[0]
        out.append((data, tos, gso))
    return out


def _reads(rx: socket.socket, gro: bool, datagrams: int, wire_bytes: int) -> list:
    """Every read of a pass of ``datagrams`` datagrams, ``wire_bytes`` in all: one a
    datagram, or with UDP_GRO one a GSO message, until they add up."""
    if not gro:
        return _receive(rx, datagrams)
    got: list = []
    while sum(len(data) for data, _, _ in got) < wire_bytes:
        got += _receive(rx, 1)
    return got


CASES = [(1, 8, 0), (7, 8, 1), (1000, 37, 2), (5000, 366, 3), (20_000, 366, 4)]


@pytest.mark.parametrize("gro", [False, True], ids=["datagrams", "gso-messages"])
@pytest.mark.parametrize("gso", [False, True], ids=["no-gso", "gso"])
@pytest.mark.parametrize("with_tos", [False, True], ids=["no-tos", "tos"])
@pytest.mark.parametrize("total,stride,seed", CASES)
def test_compiled_and_numpy_batches_put_the_same_datagrams_on_the_wire(
        lib, sockets, total, stride, seed, with_tos, gso, gro) -> None:
    rx, tx = sockets
    rx.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
    if gro:
        rx.setsockopt(batch.SOL_UDP, batch.UDP_GRO, 1)
    rng = np.random.default_rng(seed)
    packets = sender.Packets(rng.standard_normal(total).astype(np.float32), job=3,
                             message=seed + 1, kind=int(base.Kind.PUSH), stride=stride)
    n = len(packets)
    order = rng.permutation(n)[:max(1, n - n // 5)]   # some slots, in a shuffled order
    packets.number(order, 10, 0)
    tos = rng.choice([0, 0x28, 0x48], n).astype(np.int64) if with_tos else None
    if tos is not None:
        tos[: n // 2] = 0x28   # long runs of one TOS too, for GSO to join
    # Bursts of random sizes, the same for both.
    bursts, first = [], 0
    r = random.Random(seed)
    while first < len(order):
        count = min(len(order) - first, r.choice([1, 3, 16, 44, 128, 400]))
        bursts.append((first, count))
        first += count
    addr = rx.getsockname()
    seen = []
    for native in (False, True):
        b = _batch(packets, native, tx, order, addr, tos, gso)
        for first, count in bursts:
            b.send(first, count)
            # (read burst by burst: the receive buffer holds a burst, not a pass)
            burst = order[first:first + count]
            seen.append(_reads(rx, gro, count, int(packets.lengths[burst].sum())))
        assert b.gso == gso
    half = len(seen) // 2
    numpy_reads, compiled_reads = seen[:half], seen[half:]
    assert compiled_reads == numpy_reads
    if not gro:   # and they are the slots asked for, in order
        wire_bytes = [d for burst in compiled_reads for d, _, _ in burst]
        assert wire_bytes == [packets.datagram(int(s)) for s in order]
        if tos is not None:
            assert [t for burst in compiled_reads for _, t, _ in burst] == \
                [int(tos[s]) for s in order]


def test_a_slot_or_range_outside_the_pass_is_refused_and_nothing_is_sent(
        lib, sockets) -> None:
    rx, tx = sockets
    packets = sender.Packets(np.arange(100, dtype=np.float32), job=1, message=1, kind=1,
                             stride=10)
    addr = rx.getsockname()
    for order in (np.array([0, 1, 10]), np.array([3, -1])):
        b = _batch(packets, True, tx, order, addr)
        with pytest.raises(ValueError, match="outside the batch"):
            b.send(0, len(order))
    b = _batch(packets, True, tx, np.array([0, 1]), addr)
    with pytest.raises(ValueError, match="outside the batch"):
        b.send(1, 2)   # past the pass's end
    ends = packets.ends.copy()
    ends[2] = 101   # a range past the values
    b = batch.CompiledBatch(lib, tx, packets.headers, packets.values, packets.starts, ends,
                            np.array([0, 1, 2]), addr)
    with pytest.raises(ValueError, match="outside the batch"):
        b.send(0, 3)
    rx.settimeout(0.2)
    with pytest.raises(TimeoutError):
        rx.recv(2000)


def test_packets_use_the_compiled_batch_where_the_library_is_loaded(lib, sockets,
                                                                    monkeypatch) -> None:
    rx, tx = sockets
    packets = sender.Packets(np.arange(100, dtype=np.float32), job=1, message=1, kind=1,
                             stride=10)
    order = np.arange(len(packets))
    assert isinstance(packets.batch(tx, order, rx.getsockname()), batch.CompiledBatch)
    monkeypatch.setattr(rxfast, "library", lambda: None)
    assert isinstance(packets.batch(tx, order, rx.getsockname()), batch.Batch)


SO_NO_CHECK = 11  # <asm-generic/socket.h>: a socket without UDP checksums gets no GSO


@pytest.mark.parametrize("native", [False, True], ids=["numpy", "compiled"])
def test_a_kernel_refusing_gso_gets_one_datagram_a_message_from_the_first_burst(
        lib, sockets, monkeypatch, native) -> None:
    rx, tx = sockets
    if not native:
        monkeypatch.setattr(rxfast, "library", lambda: None)
    tx.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)   # UDP_SEGMENT: EINVAL
    packets = sender.Packets(np.arange(1000, dtype=np.float32), job=1, message=1, kind=1,
                             stride=100)
    order = np.arange(len(packets))[::-1].copy()
    b = packets.batch(tx, order, rx.getsockname(), gso=True)
    assert b.gso
    b.send(0, 4)
    b.send(4, 6)
    assert not b.gso
    assert [rx.recv(2000) for _ in order] == [packets.datagram(int(s)) for s in order]


def test_a_batch_sends_the_order_it_was_given(lib, sockets) -> None:
    rx, tx = sockets
    packets = sender.Packets(np.arange(100, dtype=np.float32), job=1, message=1, kind=1,
                             stride=10)
    order = np.arange(len(packets))
    b = _batch(packets, True, tx, order, rx.getsockname())
    order[0] = 7   # (as Batch does, which built its pieces from the order given)
    b.send(0, 1)
    assert rx.recv(2000) == packets.datagram(0)


def test_a_batch_whose_socket_was_closed_sends_on_no_other(lib, sockets) -> None:
    rx, tx = sockets
    packets = sender.Packets(np.arange(100, dtype=np.float32), job=1, message=1, kind=1,
                             stride=10)
    b = _batch(packets, True, tx, np.arange(len(packets)), rx.getsockname())
    fd = tx.fileno()
    tx.close()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
        moved = other.fileno() != fd   # (a new socket often gets the number anyway)
        if moved:
            os.dup2(other.fileno(), fd)   # another socket under the closed one's number
        try:
            with pytest.raises(OSError) as closed:
                b.send(1, 1)
        finally:
            if moved:
                os.close(fd)
    assert closed.value.errno == errno.EBADF


def test_rows_missing_for_some_slots_and_ranges_past_the_pass_are_refused(lib, sockets) -> None:
    rx, tx = sockets
    packets = sender.Packets(np.arange(100, dtype=np.float32), job=1, message=1, kind=1,
                             stride=10)
    order, addr = np.arange(len(packets)), rx.getsockname()
    for headers, ends, tos in ((packets.headers[:2].copy(), packets.ends, None),
                               (packets.headers, packets.ends[:2].copy(), None),
                               (packets.headers, packets.ends, np.zeros(2, np.int32))):
        with pytest.raises(ValueError):
            batch.CompiledBatch(lib, tx, headers, packets.values, packets.starts, ends,
                                order, addr, tos)
    b = _batch(packets, True, tx, order, addr)
    with pytest.raises(ValueError, match="outside the batch"):
        b.send(1, 2**63 - 1)


# ---- pacing in txfast.c (txfast_pace) ------------------------------------------------


def _paced_pass(tx, rx, n: int = 120, stride: int = 360):
    packets = sender.Packets(np.arange(n * stride, dtype=np.float32), job=1, message=1,
                             kind=1, stride=stride)
    order = np.random.default_rng(0).permutation(len(packets))
    packets.number(order, 0, 0)
    return packets, order, packets.batch(tx, order, rx.getsockname())


def test_compiled_pacing_sends_bursts_until_the_pass_ends_or_it_is_interrupted(
        lib, sockets) -> None:
    rx, tx = sockets
    packets, order, b = _paced_pass(tx, rx)
    wire_before = sender.wire_bytes_before(packets, order)
    b.interrupt()   # set before the call: one burst, then back to the caller
    assert b.pace(0, 7, 5, 1e9, 0.0, 100, None, wire_before, 0.004)[:2] == (0, 7)
    assert b.pace(7, 5, 5, 1e9, 0.0, 100, None, wire_before, 0.004)[:2] == (7, 12)
    b.clear()
    assert b.pace(12, 5, 5, None, 0.0, 2, None, wire_before, 0.004)[:2] == (17, 22)
    # Then to the end, its last burst cut to what is left.
    assert b.pace(22, 5, 5, None, 0.0, 100, None, wire_before, 0.004)[:2] == (117, 120)
    assert [rx.recv(2000) for _ in order] == [packets.datagram(int(s)) for s in order]


def test_compiled_pacing_keeps_to_the_rate_between_its_bursts(lib, sockets) -> None:
    """120 datagrams of 1478 wire bytes in bursts of 10 at 50 Mbit/s: 11 sleeps after
    the bursts but the last, which the caller paces, of 2.4 ms each."""
    rx, tx = sockets
    packets, order, b = _paced_pass(tx, rx)
    wire_before = sender.wire_bytes_before(packets, order)
    start = time.monotonic()
    last, end, due = b.pace(0, 10, 10, 50e6, start, 100, None, wire_before, 0.004)
    took = time.monotonic() - start
    expected = 8 * int(wire_before[last]) / 50e6   # 26 ms
    assert (last, end) == (110, 120)
    assert expected <= took < expected + 0.05 and due == pytest.approx(start + expected,
                                                                       abs=1e-6)


def test_a_compiled_pass_alone_on_its_link_stops_mid_pass_at_done(lib, sockets) -> None:
    """One call paces the whole pass; DONE (the stop event and the schedule's
    changed(), as datagram.py does) ends it after the burst under way."""
    rx, tx = sockets
    packets, order, _ = _paced_pass(tx, rx, n=400)
    link = srpt.LinkSchedule(20e6)   # 400 datagrams: 0.24 s
    turn = link.enter(10**9, lambda: None)
    stop = threading.Event()
    calls = []
    real = batch.CompiledBatch.pace

    def counted(self, *a, **k):
        calls.append(a[0])
        return real(self, *a, **k)

    def done() -> None:
        time.sleep(0.05)
        stop.set()
        link.changed()

    threading.Thread(target=done, daemon=True).start()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(batch.CompiledBatch, "pace", counted)
        result = sender.pace(tx, rx.getsockname(), packets, order, None, stop, None, "peer",
                             turn=turn)
    assert calls == [0] and 0 < result.sent < 200 and turn.on_change is None


def test_compiled_pacing_on_a_kernel_refusing_gso_sends_the_pass_one_datagram_a_message(
        lib, sockets) -> None:
    rx, tx = sockets
    tx.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)   # UDP_SEGMENT: EINVAL
    packets = sender.Packets(np.arange(1000, dtype=np.float32), job=1, message=1, kind=1,
                             stride=100)
    order = np.arange(len(packets))[::-1].copy()
    b = packets.batch(tx, order, rx.getsockname(), gso=True)
    wire_before = sender.wire_bytes_before(packets, order)
    assert b.pace(0, 4, 3, None, 0.0, 100, None, wire_before, 0.004)[:2] == (7, 10)
    assert not b.gso
    assert [rx.recv(2000) for _ in order] == [packets.datagram(int(s)) for s in order]


class _DownOnce(batch.CompiledBatch):
    """A compiled batch whose second burst the path refuses (ENETUNREACH)."""

    def __init__(self) -> None:   # (nothing of a real batch is needed)
        self.calls = 0

    def pace(self, first, first_burst, burst, rate_bit, due, bursts, until, wire_before,
             catch_up_s):
        self.calls += 1
        if self.calls == 1:   # two bursts of 8 went out, the third was refused
            self.failed = (16, 24, due)
            raise OSError(errno.ENETUNREACH, "Network is unreachable")
        return 32, 40, due    # the rest in three bursts

    def clear(self) -> None:
        pass

    def interrupt(self) -> None:
        pass


def test_a_burst_the_path_refuses_while_paced_in_compiled_code_is_lost_and_the_pass_goes_on(
        monkeypatch) -> None:
    packets = sender.Packets(np.arange(4000, dtype=np.float32), 5, 6, 1, 100)
    down = _DownOnce()
    monkeypatch.setattr(sender.Packets, "batch", lambda *a, **k: down)
    link = srpt.LinkSchedule(None)
    turn = link.enter(10**6, lambda: None)
    outage = sender.Outage()
    outcome = sender.pace(None, ("127.0.0.1", 9), packets, np.arange(40), None,  # type: ignore
                          threading.Event(), None, "peer", outage=outage, turn=turn)
    assert down.calls == 2 and outcome == sender.Pass(sent=32, unsent=8)
    assert outage.since is None and outage.unsent == 8
