"""rxfast.c against the numpy code it stands in for: the same batches, well-formed,
duplicated or hostile, leave the same vector, mask, counts and reasons; and a machine
set up by the README runs the compiled path."""

import collections
import os
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from tailcut.transports import receiver, rxfast, sender, wire
from tailcut.transports.base import Kind

JOB = 0x51
STRIDE = 360
PEER_IP = 0x0A000002
MESSAGE = (1 << 16) | 7
ROW = wire.HEADER_BYTES + 4 * STRIDE


@dataclass(eq=False)
class Peer:
    peer_id: int = 1
    udp_addr: tuple[str, int] = ("10.0.0.2", 9)


def test_the_compiled_receive_path_is_in_use_after_the_readmes_set_up() -> None:
    assert rxfast.library() is not None, rxfast.status()
    assert rxfast.status() == "compiled"


def test_without_it_the_status_says_why() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "from tailcut.transports import rxfast; print(rxfast.status())"],
        env={**os.environ, "TAILCUT_NATIVE": "0"}, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "numpy (off (TAILCUT_NATIVE=0))"


HOSTILE = 9  # ways a datagram goes wrong, below


def _hostile(d: bytearray, how: int, cut: int = 100) -> tuple[bytes, int]:
    """Datagram ``d`` gone wrong in way ``how``, and the source it comes from."""
    words = np.frombuffer(d, ">u4", count=8).copy()
    source = PEER_IP
    if how == 0:
        words[0] ^= 1                      # magic
    elif how == 1:
        words[5] = words[5] + 1            # start off the slot grid (or past total)
    elif how == 2:
        words[6] = words[6] - 1            # end short of the slot
    elif how == 3:
        words[7] = words[7] + STRIDE       # another total
    elif how == 4:
        words[3] ^= 0x10000                # another message
    elif how == 5:
        words[2] ^= 0xFF                   # another job
    elif how == 6:
        words[1] |= 0x80 << 16             # an unknown flag
    elif how == 7:
        source = PEER_IP + 1               # someone else, same headers
    out = words.astype(">u4").tobytes() + bytes(d[32:])
    if how == 8:
        out = out[:cut]                    # cut short (the header may be whole)
    return out, source


def _batches(seed: int, total: int) -> list[list[tuple[bytes, int]]]:
    """A message's datagrams in shuffled batches: some clean, some with duplicates
    (a few with other values), some with a hostile datagram among them."""
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(total).astype(np.float32)
    packets = sender.Packets(values, JOB, MESSAGE, int(Kind.PUSH), STRIDE)
    order = rng.permutation(len(packets))
    order = np.concatenate([order, rng.choice(len(packets), len(packets) // 3)])
    batches: list[list[tuple[bytes, int]]] = []
    at = 0
    while at < len(order):
        size = int(rng.integers(1, 50))
        batch = []
        for slot in order[at:at + size].tolist():
            d = bytearray(packets.datagram(slot))
            if rng.random() < 0.1:  # a copy with other values: which one is kept matters
                other = bytearray(d)
                other[32:36] = np.float32(rng.standard_normal()).tobytes()
                batch.append((bytes(other), PEER_IP))
            batch.append((bytes(d), PEER_IP))
            if rng.random() < 0.05:
                batch.append(_hostile(bytearray(d), int(rng.integers(HOSTILE)),
                                      int(rng.integers(1, len(d)))))
        rng.shuffle(batch)  # type: ignore[arg-type]
        batches.append(batch)
        at += size
    return batches


def _run(r: receiver.Receiver, batches: list[list[tuple[bytes, int]]],
         total: int) -> list[receiver.Done]:
    peer = Peer()
    r.peers[1] = (peer, PEER_IP)
    done = r.begin(peer, PEER_IP, MESSAGE, int(Kind.PUSH), 0, 0, total, 0)
    _run_more(r, batches, done)
    return done


def _run_more(r: receiver.Receiver, batches: list[list[tuple[bytes, int]]],
              done: list[receiver.Done] | None = None) -> None:
    done = [] if done is None else done
    for batch in batches:
        data = np.zeros((len(batch), ROW), np.uint8)
        for i, (d, _) in enumerate(batch):
            data[i, :min(len(d), ROW)] = np.frombuffer(d[:ROW], np.uint8)
        lengths = np.array([len(d) for d, _ in batch], np.int64)
        sources = np.array([s for _, s in batch], np.int64)
        r.accept(data, lengths, sources, done)


@pytest.mark.parametrize("seed", range(60))
def test_compiled_and_numpy_leave_the_same_message_and_counts(seed: int) -> None:
    total = [10_000, 360 * 12, 361, 1][seed % 4]
    batches = _batches(seed, total)
    results = []
    for compiled in (True, False):
        r = receiver.Receiver(JOB, STRIDE, 1.0, True, False, 1 << 20, collections.Counter())
        if not compiled:
            r.native = None
        assert (r.native is not None) == compiled
        done = _run(r, batches, total)
        assert [d.reason for d in done] == ["full"]
        rx = done[0].rx
        assert (rx.native is not None) == compiled
        results.append((rx.values.tobytes(), rx.mask.tobytes(), rx.seen.tobytes(),
                        rx.count, rx.wire_bytes, dict(r.stats)))
    assert results[0] == results[1]
    assert results[0][3] == total   # every slot came at least once, well-formed


@pytest.mark.parametrize("how", range(HOSTILE))
def test_a_hostile_datagram_among_good_ones_writes_nothing_either_way(how: int) -> None:
    """A batch of good packets and one hostile one of a slot not yet seen: the good
    ones land, the hostile one is refused under the same reason, its slot stays empty."""
    values = np.arange(STRIDE * 4, dtype=np.float32) + 1
    packets = sender.Packets(values, JOB, MESSAGE, int(Kind.PUSH), STRIDE)
    batch = [(packets.datagram(0), PEER_IP), (packets.datagram(2), PEER_IP),
             _hostile(bytearray(packets.datagram(1)), how, cut=wire.HEADER_BYTES + 40)]
    results = []
    for compiled in (True, False):
        r = receiver.Receiver(JOB, STRIDE, 1.0, True, False, 1 << 20, collections.Counter())
        if not compiled:
            r.native = None
        _run(r, [batch], values.size)
        rx = r.rx[MESSAGE]
        assert rx.seen.tolist() == [True, False, True, False]
        assert not rx.mask[STRIDE:2 * STRIDE].any() and not rx.values[STRIDE:2 * STRIDE].any()
        results.append((rx.values.tobytes(), rx.count, dict(r.stats)))
    assert results[0] == results[1]
    assert results[0][1] == 2 * STRIDE


@pytest.mark.parametrize("how", range(HOSTILE))
def test_packets_after_p_are_counted_late_either_way_and_write_nothing(how: int) -> None:
    """At p = 0.9 the message is delivered with 10% of its packets still to come: good
    ones are counted late, a hostile one under its reason, and the delivered vector,
    mask and seen slots do not change (rxfast.c takes them through a finished
    message's view, every slot seen and no array behind it)."""
    total = STRIDE * 40
    values = np.arange(total, dtype=np.float32) + 1
    packets = sender.Packets(values, JOB, MESSAGE, int(Kind.PUSH), STRIDE)
    first = [(packets.datagram(slot), PEER_IP) for slot in range(36)]
    tail = [(packets.datagram(slot), PEER_IP) for slot in range(36, 40)]
    tail.insert(2, _hostile(bytearray(packets.datagram(38)), how))
    results = []
    for compiled in (True, False):
        r = receiver.Receiver(JOB, STRIDE, 0.9, True, False, 1 << 20, collections.Counter())
        if not compiled:
            r.native = None
        done = _run(r, [first], total)
        assert [d.reason for d in done] == ["p"]
        rx = done[0].rx
        before = (rx.values.tobytes(), rx.mask.tobytes(), rx.seen.tobytes(), rx.count)
        _run_more(r, [tail[:3], tail[3:]])
        assert (rx.values.tobytes(), rx.mask.tobytes(), rx.seen.tobytes(), rx.count) == before
        results.append(dict(r.stats))
    assert results[0] == results[1]
    assert results[0]["late"] >= 4 and results[0]["accepted"] == 36   # (some hostile ones look late)


@pytest.mark.parametrize("seed", range(20))
def test_runs_of_two_messages_in_one_batch_are_taken_as_numpy_takes_the_batch(
        seed: int) -> None:
    """Two peers' messages coming in together: a read holds runs of each (one per GSO
    message), some with a duplicate or a hostile datagram among them. The compiled
    path takes the batch run by run; the result is numpy's for the whole batch."""
    rng = np.random.default_rng(seed)
    peers = [(Peer(1, ("10.0.0.2", 9)), PEER_IP, (1 << 16) | 3),
             (Peer(2, ("10.0.0.3", 9)), PEER_IP + 1, (2 << 16) | 5)]
    total = 360 * 40 + 17
    streams = []
    for _, ip, message in peers:
        packets = sender.Packets(rng.standard_normal(total).astype(np.float32), JOB, message,
                                 int(Kind.PUSH), STRIDE)
        order = np.concatenate([rng.permutation(len(packets)), rng.choice(len(packets), 8)])
        rows = []
        for slot in order.tolist():
            d = packets.datagram(slot)
            rows.append(_hostile(bytearray(d), int(rng.integers(HOSTILE)), 90)
                        if rng.random() < 0.03 else (d, ip))
        streams.append(rows)
    batches, batch = [], []  # runs of 1-44 rows from either stream, 1-4 runs a read
    while any(streams):
        s = streams[int(rng.integers(2))] or streams[0] or streams[1]
        run = int(rng.integers(1, 45))
        batch += s[:run]
        del s[:run]
        if rng.random() < 0.4 or not any(streams):
            batches.append(batch)
            batch = []
    results = []
    for compiled in (True, False):
        r = receiver.Receiver(JOB, STRIDE, 1.0, True, False, 1 << 20, collections.Counter())
        if not compiled:
            r.native = None
        done: list[receiver.Done] = []
        for peer, ip, message in peers:
            r.peers[peer.peer_id] = (peer, ip)
            done += r.begin(peer, ip, message, int(Kind.PUSH), 0, 0, total, 0)
        for b in batches:
            data = np.zeros((len(b), ROW), np.uint8)
            for i, (d, _) in enumerate(b):
                data[i, :min(len(d), ROW)] = np.frombuffer(d[:ROW], np.uint8)
            r.accept(data, np.array([len(d) for d, _ in b], np.int64),
                     np.array([s for _, s in b], np.int64), done)
        live = [r.rx.get(m) for _, _, m in peers]
        every = [d.rx for d in done] + [rx for rx in live if rx is not None]
        results.append(([d.reason for d in done], dict(r.stats),
                        [(rx.message, rx.values.tobytes(), rx.mask.tobytes(), rx.count)
                         for rx in sorted(every, key=lambda rx: rx.message)]))
    assert results[0] == results[1]


def test_a_receiver_with_early_close_takes_every_read_as_numpy_does() -> None:
    """Early close estimates a message's packet gaps from what each read brings of it:
    such a receiver keeps the numpy path (runs would split the estimate), and with the
    library loaded ends with the same gaps, pass state and values as without."""
    total = STRIDE * 200
    batches = _batches(3, total)
    results = []
    for compiled in (True, False):
        r = receiver.Receiver(JOB, STRIDE, 1.0, True, False, 1 << 20, collections.Counter(),
                              min_p=0.5)
        if not compiled:
            r.native = None
        peer = Peer()
        r.peers[1] = (peer, PEER_IP)
        done = r.begin(peer, PEER_IP, MESSAGE, int(Kind.PUSH), 0, 0, total, 0)
        for i, batch in enumerate(batches[:3]):
            data = np.zeros((len(batch), ROW), np.uint8)
            for j, (d, _) in enumerate(batch):
                data[j, :min(len(d), ROW)] = np.frombuffer(d[:ROW], np.uint8)
            arrivals = 1_000_000 * i + 7_000 * np.arange(len(batch), dtype=np.int64)
            r.accept(data, np.array([len(d) for d, _ in batch], np.int64),
                     np.array([s for _, s in batch], np.int64), done, arrivals)
        rx = r.rx[MESSAGE]
        results.append((rx.gap_ns, rx.last_arrival_ns, rx.pass_over, rx.values.tobytes(),
                        rx.count, dict(r.stats)))
    assert results[0] == results[1]
    assert results[0][0] is not None


def test_fewer_lengths_or_sources_than_rows_are_refused_as_numpy_refuses_them() -> None:
    values = np.arange(STRIDE * 4, dtype=np.float32)
    packets = sender.Packets(values, JOB, MESSAGE, int(Kind.PUSH), STRIDE)
    data = np.zeros((4, ROW), np.uint8)
    for slot in range(4):
        d = packets.datagram(slot)
        data[slot, :len(d)] = np.frombuffer(d, np.uint8)
    for compiled in (True, False):
        r = receiver.Receiver(JOB, STRIDE, 1.0, True, False, 1 << 20, collections.Counter())
        if not compiled:
            r.native = None
        peer = Peer()
        r.peers[1] = (peer, PEER_IP)
        r.begin(peer, PEER_IP, MESSAGE, int(Kind.PUSH), 0, 0, values.size, 0)
        with pytest.raises(ValueError):
            r.accept(data, packets.lengths[:2].astype(np.int64), np.full(4, PEER_IP), [])
        assert not r.rx[MESSAGE].seen.any()
