"""The receiver's state, without sockets: batches of packets fill the vector exactly,
each slot counts once, hostile packets are counted under their reason and write
nothing, packets before BEGIN wait for it, and p is a floor."""

import collections
from dataclasses import dataclass

import numpy as np
import pytest

from tailcut.transports import receiver, sender, wire
from tailcut.transports.base import Kind

# Every test both ways: rxfast.c and numpy (conftest.py).
pytestmark = pytest.mark.usefixtures("receive_path")

JOB = 0x1234
STRIDE = 360
PEER_IP = 0x0A000001
VECTOR = np.random.default_rng(5).standard_normal(10_000).astype(np.float32)  # 28 slots
MESSAGE = (1 << 16) | 1


@dataclass(eq=False)
class Peer:
    peer_id: int = 1
    udp_addr: tuple[str, int] = ("10.0.0.1", 9)


def new(p: float = 1.0, xdp: bool = False) -> tuple[receiver.Receiver, Peer]:
    r = receiver.Receiver(JOB, STRIDE, p, True, xdp, 1 << 20, collections.Counter())
    peer = Peer()
    r.peers[1] = (peer, PEER_IP)
    return r, peer


def begin(r: receiver.Receiver, peer: Peer, total: int = VECTOR.size) -> list[receiver.Done]:
    return r.begin(peer, PEER_IP, MESSAGE, int(Kind.PUSH), 0, 0, total, 0)


def rows(datagrams: list[bytes], row_bytes: int = wire.HEADER_BYTES + 4 * STRIDE) \
        -> tuple[np.ndarray, np.ndarray]:
    data = np.zeros((len(datagrams), row_bytes), np.uint8)
    for i, d in enumerate(datagrams):
        data[i, :min(len(d), row_bytes)] = np.frombuffer(d[:row_bytes], np.uint8)
    return data, np.array([len(d) for d in datagrams])


def send(r: receiver.Receiver, datagrams: list[bytes], source: int = PEER_IP) \
        -> list[receiver.Done]:
    data, lengths = rows(datagrams)
    done: list[receiver.Done] = []
    r.accept(data, lengths, np.full(len(datagrams), source), done)
    return done


PACKETS = sender.Packets(VECTOR, JOB, MESSAGE, int(Kind.PUSH), STRIDE)
SLOTS = len(PACKETS)


def datagram(slot: int) -> bytes:
    return PACKETS.datagram(slot)


def test_shuffled_batches_with_duplicates_fill_the_vector_and_count_each_slot_once() -> None:
    r, peer = new()
    begin(r, peer)
    order = np.random.default_rng(1).permutation(SLOTS).tolist()
    done: list[receiver.Done] = []
    # Every slot three times, in batches of 7 that mix new slots and repeats.
    stream = order + order[::-1] + order
    for i in range(0, len(stream), 7):
        done += send(r, [datagram(s) for s in stream[i:i + 7]])
    assert [d.reason for d in done] == ["full"]
    rx = done[0].rx
    assert np.array_equal(rx.values, VECTOR) and rx.mask.all()
    assert rx.count == VECTOR.size and r.stats["accepted"] == SLOTS
    assert r.stats["duplicate"] + r.stats["late"] == 2 * SLOTS


def test_a_batch_of_one_slot_many_times_counts_it_once() -> None:
    r, peer = new()
    begin(r, peer)
    send(r, [datagram(3)] * 50)
    rx = r.rx[MESSAGE]
    assert rx.count == STRIDE and rx.seen.sum() == 1 and r.stats["duplicate"] == 49


def test_hostile_packets_are_counted_by_reason_and_write_nothing() -> None:
    r, peer = new()
    begin(r, peer)
    h = wire.header_type()

    def forged(slot: int = 0, **fields: int) -> bytes:
        d = datagram(slot)
        x = h.from_buffer_copy(d[:wire.HEADER_BYTES])
        for k, v in fields.items():
            setattr(x, k, v)
        return bytes(x) + b"\xff" * (len(d) - wire.HEADER_BYTES)  # NaN payloads

    rng = np.random.default_rng(2)
    bad = [forged(magic=0), forged(version=9), forged(start=5, end=365),  # misaligned
           forged(end=0), forged(total=VECTOR.size + 1), forged(job=JOB + 1),
           forged(kind=int(Kind.PARAMS)), forged(start=9720, end=10080),  # past total
           datagram(0)[:-4], datagram(0) + b"xxxx", b"", datagram(0)[:20],
           forged(message=(2 << 16) | 1), forged(reserved=1),  # peer 2 is unknown
           *[rng.bytes(int(rng.integers(0, 1500))) for _ in range(100)]]
    assert send(r, bad) == []
    rx = r.rx[MESSAGE]
    assert rx.count == 0 and not rx.seen.any() and not rx.mask.any()
    assert not rx.values.any()
    st = r.stats
    assert st["bad_packet"] >= 100 and st["misaligned"] == 1 and st["unknown_job"] == 1
    assert st["mismatch"] == 2 and st["unknown_message"] == 1
    # Packets from another address for the live message are not the peer's.
    send(r, [datagram(1)], source=PEER_IP + 1)
    assert st["foreign_source"] == 1 and rx.count == 0
    # The message itself still arrives whole.
    done = send(r, [datagram(s) for s in range(SLOTS)])
    assert done[0].reason == "full" and np.array_equal(done[0].rx.values, VECTOR)


def test_a_batch_whose_only_well_formed_packets_are_of_another_job_is_counted_and_dropped() -> None:
    # The datagram transport reads whatever recvmmsg returns; a batch can hold just
    # these. It once raised on the empty remainder and ended the receiving thread.
    r, peer = new()
    begin(r, peer)
    h = wire.header_type()
    other = h.from_buffer_copy(datagram(0)[:wire.HEADER_BYTES])
    other.job = JOB + 1
    other_job = bytes(other) + datagram(0)[wire.HEADER_BYTES:]
    for batch in ([other_job], [b"", datagram(0)[:20], other_job]):
        assert send(r, batch) == []
    assert r.stats["unknown_job"] == 2 and r.stats["bad_packet"] == 2
    done = send(r, [datagram(s) for s in range(SLOTS)])
    assert done[0].reason == "full" and np.array_equal(done[0].rx.values, VECTOR)


def test_packets_before_begin_wait_for_it_and_then_count() -> None:
    r, peer = new()
    assert send(r, [datagram(s) for s in range(0, SLOTS, 2)]) == []
    assert r.stats["accepted"] == 0
    assert send(r, [datagram(1)], source=PEER_IP + 1) == []  # not from the peer: dropped
    begin(r, peer)
    rx = r.rx[MESSAGE]
    assert rx.seen.sum() == len(range(0, SLOTS, 2)) and r.stats["unknown_message"] == 1
    done = send(r, [datagram(s) for s in range(1, SLOTS, 2)])
    assert done[0].reason == "full" and np.array_equal(done[0].rx.values, VECTOR)


def test_p_is_a_floor_and_with_xdp_completion_also_waits_for_the_event() -> None:
    r, peer = new(p=0.5, xdp=True)
    begin(r, peer)
    threshold = receiver.threshold_elements(0.5, VECTOR.size)
    need = -(-threshold // STRIDE)
    assert send(r, [datagram(s) for s in range(need - 1)]) == []
    assert send(r, [datagram(need - 1)]) == []  # p reached, but no event yet
    done: list[receiver.Done] = []
    r.fired(MESSAGE, 123, done)
    assert [d.reason for d in done] == ["xdp"] and done[0].rx.count >= threshold
    assert done[0].rx.event_ns == 123
    assert send(r, [datagram(need)]) == [] and r.stats["late"] == 1


def test_a_pass_that_ends_below_p_is_nacked_with_exactly_the_missing_slots() -> None:
    r, peer = new(p=0.9)
    begin(r, peer)
    send(r, [datagram(s) for s in range(SLOTS) if s % 4])
    r.end(peer, MESSAGE)
    done: list[receiver.Done] = []
    r.sweep(r.rx[MESSAGE].end_at + 1, r.rx[MESSAGE].end_ns, 0.0, done)
    assert [d.reason for d in done] == ["nack"]
    assert np.frombuffer(done[0].missing, ">u4").tolist() == list(range(0, SLOTS, 4))


def test_the_short_last_slot_is_written_to_the_end_and_no_further() -> None:
    total = 3 * STRIDE + 7
    packets = sender.Packets(VECTOR[:total], JOB, MESSAGE, int(Kind.PUSH), STRIDE)
    r, peer = new()
    begin(r, peer, total)
    done = send(r, [packets.datagram(s) for s in (3, 1, 0, 2)])
    assert done[0].reason == "full" and np.array_equal(done[0].rx.values, VECTOR[:total])


def test_a_tagged_pass_is_over_only_once_the_end_of_every_class_is_in() -> None:
    r, peer = new(p=0.9)
    begin(r, peer)
    send(r, [datagram(s) for s in range(SLOTS) if s % 4])
    for _ in range(2):  # two passes: the count starts again after each
        r.end(peer, MESSAGE, of=3)
        r.end(peer, MESSAGE, of=3)
        assert r.rx[MESSAGE].end_at is None  # a class's packets may still be queued
        r.end(peer, MESSAGE, of=3)
        rx = r.rx[MESSAGE]
        assert rx.end_at is not None
        done: list[receiver.Done] = []
        r.sweep(rx.end_at + 1, rx.end_ns, 0.0, done)
        assert [d.reason for d in done] == ["nack"] and rx.end_at is None


def test_a_tagged_message_counts_its_elements_not_the_padding_and_times_each_cut() -> None:
    from tailcut.transports import base, cutlayout
    cuts = (base.Cut(9_000, 1_000, 0), base.Cut(0, 9_000, 1))  # 3 + 25 slots
    layout = cutlayout.plan(cuts, VECTOR.size, STRIDE)
    packets = sender.Packets(layout.to_wire(VECTOR), JOB, MESSAGE, int(Kind.PUSH), STRIDE)
    r, peer = new(p=1.0)
    r.begin(peer, PEER_IP, MESSAGE, int(Kind.PUSH), 0, 0, layout.total, 0, layout)
    rx = r.rx[MESSAGE]
    assert rx.threshold == VECTOR.size and rx.elements == VECTOR.size
    assert send(r, [packets.datagram(s) for s in range(3)]) == []
    assert rx.count == 1_000 and rx.cut_done_ns[0] > 0 and rx.cut_done_ns[1] == 0
    done = send(r, [packets.datagram(s) for s in range(3, len(packets))])
    assert [d.reason for d in done] == ["full"] and rx.cut_done_ns[1] >= rx.cut_done_ns[0]
    values, mask = layout.from_wire(rx.values, rx.mask)
    assert mask.all() and np.array_equal(values, VECTOR)


# ---- early close (min_p < p): what arrived, once the pass is over and quiet ----------------

GAP_NS = 12_000  # 1 Gbit/s of full packets
T0 = 1_700_000_000_000_000_000  # kernel arrival times are CLOCK_REALTIME


def early(min_p: float | None, p: float = 0.9) -> tuple[receiver.Receiver, Peer]:
    r = receiver.Receiver(JOB, STRIDE, p, True, False, 1 << 20, collections.Counter(), min_p)
    peer = Peer()
    r.peers[1] = (peer, PEER_IP)
    begin(r, peer)
    return r, peer


def one_pass(r: receiver.Receiver, slots: list[int], lost: set[int]) -> int:
    """A pass over ``slots`` in that order, LAST on the last one, GAP_NS apart; the
    ``lost`` ones never arrive. Returns the arrival time of the newest that did."""
    packets = sender.Packets(VECTOR, JOB, MESSAGE, int(Kind.PUSH), STRIDE)
    packets.number(np.array(slots), 0, 0)
    got = [(s, T0 + i * GAP_NS) for i, s in enumerate(slots) if s not in lost]
    data, lengths = rows([packets.datagram(s) for s, _ in got])
    done: list[receiver.Done] = []
    r.accept(data, lengths, np.full(len(got), PEER_IP), done,
             np.array([t for _, t in got], np.int64))
    assert done == []
    return got[-1][1]


def sweep_at(r: receiver.Receiver, read_up_to_ns: int) -> list[str]:
    done: list[receiver.Done] = []
    r.sweep(0.0, read_up_to_ns, 2e-3, done)
    return [d.reason for d in done]


def test_a_message_closes_early_with_what_arrived_once_its_pass_is_over_and_quiet() -> None:
    r, _ = early(min_p=0.6)
    lost = {0, 5, 9, 14, 20}
    newest = one_pass(r, list(range(SLOTS)), lost)  # 82% < p = 0.9
    rx = r.rx[MESSAGE]
    quiet = r.quiet_ns(rx)
    # 16 of its gaps between arrivals (a lost packet widens one): 0.23 ms
    assert quiet == receiver.QUIET_GAPS * (newest - T0 - GAP_NS) // (SLOTS - len(lost) - 1)
    assert sweep_at(r, newest + quiet - 1) == []  # a reordered packet could still come
    assert sweep_at(r, newest + quiet) == ["early"]
    assert rx.threshold > rx.count >= rx.min_threshold and r.stats["early_close"] == 1
    assert np.array_equal(rx.values[rx.mask], VECTOR[rx.mask])


def test_no_early_close_before_the_pass_is_over_however_long_the_quiet() -> None:
    """A pass still under way (its LAST packet not read: the sender may only be slow)
    keeps the message open; once END is drained it closes at min_p rather than NACK."""
    r, peer = early(min_p=0.6)
    newest = one_pass(r, list(range(SLOTS)), lost={3, 7, 11, SLOTS - 1})  # LAST lost
    assert sweep_at(r, newest + 10 ** 9) == []
    r.end(peer, MESSAGE)
    rx = r.rx[MESSAGE]
    done: list[receiver.Done] = []
    r.sweep(rx.end_at + 1, rx.end_ns, 0.0, done)
    assert [d.reason for d in done] == ["end"] and rx.count < rx.threshold


def test_early_close_never_goes_below_min_p() -> None:
    r, peer = early(min_p=0.8)
    lost = set(range(0, SLOTS, 3))  # 2/3 arrive: below min_p
    newest = one_pass(r, list(range(SLOTS)), lost)
    assert sweep_at(r, newest + 10 ** 9) == []
    r.end(peer, MESSAGE)
    rx = r.rx[MESSAGE]
    done: list[receiver.Done] = []
    r.sweep(rx.end_at + 1, rx.end_ns, 0.0, done)
    assert [d.reason for d in done] == ["nack"]
    assert np.frombuffer(done[0].missing, ">u4").tolist() == sorted(lost)
    assert not rx.pass_over  # the retransmissions are a new pass, with a LAST of their own


@pytest.mark.parametrize("min_p", [None, 0.9])
def test_without_min_p_below_p_p_stays_the_floor(min_p: float | None) -> None:
    r, peer = early(min_p)
    newest = one_pass(r, list(range(SLOTS)), lost={0, 5, 9, 14, 20})
    assert not r.early_close and sweep_at(r, newest + 10 ** 9) == []
    r.end(peer, MESSAGE)
    rx = r.rx[MESSAGE]
    done: list[receiver.Done] = []
    r.sweep(rx.end_at + 1, rx.end_ns, 0.0, done)
    assert [d.reason for d in done] == ["nack"] and r.stats["early_close"] == 0


def test_the_quiet_time_follows_the_gaps_within_its_bounds() -> None:
    r, _ = early(min_p=0.5)
    rx = r.rx[MESSAGE]
    assert r.quiet_ns(rx) == receiver.QUIET_MAX_NS  # no gap seen yet
    rx.gap_ns = 1_000.0
    assert r.quiet_ns(rx) == receiver.QUIET_MIN_NS
    rx.gap_ns = 50_000.0  # a quarter of the link: 16 gaps = 0.8 ms
    assert r.quiet_ns(rx) == 800_000
    rx.gap_ns = 1e6
    assert r.quiet_ns(rx) == receiver.QUIET_MAX_NS
