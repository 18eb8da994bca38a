"""The PS's collector of in-network sums (tailcut.transports.agg) against a stand-in
ToR on loopback: sums taken once, the first of a sum and its FLUSH answer kept, a
missing slot flushed (resent until answered), a STALE answer an empty sum, malformed
packets counted, and the per-element contributors right. The real ToR program is
tested in tests/datapath/test_agg.py and end to end in tests/runtime."""

import socket
import threading
import time

import numpy as np
import pytest

from tailcut.datapath import aggformat as fmt
from tailcut.transports import agg, base

JOB = 77
ELEMENTS = 400          # slots of 360 and 40
PS, TOR = "127.0.0.1", "127.0.0.2"


def _packet(op, *, slot, iteration=0, members=0b11, status=fmt.OK, rack=1, job=JOB,
            values=None):
    n = fmt.slot_length(ELEMENTS, slot)
    payload = (np.zeros(n, "<i4") if values is None else values).tobytes()
    return fmt.header().pack(fmt.const("MAGIC"), fmt.const("VERSION"), op, status, 0, job,
                             iteration, slot, n, members, rack) + payload


@pytest.fixture
def tor():
    """A stand-in ToR at 127.0.0.2:PORT answering FLUSHes with what `answers` says."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((TOR, fmt.PORT))
    sock.settimeout(0.2)
    state = {"answers": {}, "flushes": [], "stop": False}

    def serve() -> None:
        while not state["stop"]:
            try:
                data, peer = sock.recvfrom(65536)
            except socket.timeout:
                continue
            h = fmt.header().unpack_from(data)
            slot, iteration = h[7], h[6]
            state["flushes"].append((iteration, slot))
            answer = state["answers"].get(slot)
            reply = None if answer is None else answer(iteration)
            if reply is not None:   # None: this FLUSH goes unanswered
                sock.sendto(reply, peer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield state, sock
    state["stop"] = True
    thread.join()
    sock.close()


def _collector():
    return agg.Collector(JOB, ELEMENTS, [agg.Rack(1, TOR, (0, 1))], bind=PS,
                         grace_s=0.01, resend_s=0.01)


def test_forwarded_sums_are_taken_without_a_flush(tor):
    state, sock = tor
    a, b = np.arange(360, dtype="<i4") << 20, np.full(40, 3 << 24, "<i4")
    collector = _collector()
    try:
        sock.sendto(_packet(fmt.AGGREGATE, slot=0, values=a), (PS, fmt.PORT))
        sock.sendto(_packet(fmt.AGGREGATE, slot=1, values=b), (PS, fmt.PORT))
        total, counts, got = collector.collect(0, timeout_s=5)
    finally:
        collector.close()
    assert state["flushes"] == [] and got.flushed == 0 and got.missing == 0
    assert np.array_equal(total, np.concatenate([a, b]) / 2 ** 24)
    assert np.array_equal(counts, np.full(ELEMENTS, 2.0))
    assert collector.stats.forwarded == 2


def test_a_missing_slot_is_flushed_and_a_stale_answer_is_an_empty_sum(tor):
    state, sock = tor
    attempts = []

    def stale_the_second_time(iteration):   # the first FLUSH "lost": resent
        attempts.append(iteration)
        if len(attempts) < 2:
            return None
        return _packet(fmt.FLUSH, slot=1, iteration=iteration, members=0, status=fmt.STALE)
    state["answers"][1] = lambda it: stale_the_second_time(it)
    collector = _collector()
    try:
        sock.sendto(_packet(fmt.AGGREGATE, slot=0, members=0b01), (PS, fmt.PORT))
        total, counts, got = collector.collect(0, timeout_s=5)
    finally:
        collector.close()
    assert [s for _, s in state["flushes"]] == [1, 1] and got.flushed == 1
    assert got.missing == 1 + 2     # worker 1 in slot 0, both in slot 1
    assert np.array_equal(counts, np.r_[np.ones(360), np.zeros(40)])


def test_the_first_of_a_sum_and_its_flush_answer_is_kept_and_junk_counted(tor):
    state, sock = tor
    collector = _collector()
    try:
        first, second = np.full(360, 1 << 24, "<i4"), np.full(360, 5 << 24, "<i4")
        sock.sendto(_packet(fmt.AGGREGATE, slot=0, values=first), (PS, fmt.PORT))
        sock.sendto(_packet(fmt.FLUSH, slot=0, values=second), (PS, fmt.PORT))
        for junk in (b"short", _packet(fmt.AGGREGATE, slot=1, job=JOB + 1),
                     _packet(fmt.AGGREGATE, slot=1, rack=9),
                     _packet(fmt.ADD, slot=1)):
            sock.sendto(junk, (PS, fmt.PORT))
        sock.sendto(_packet(fmt.AGGREGATE, slot=1), (PS, fmt.PORT))
        total, _, _ = collector.collect(0, timeout_s=5)
        sock.sendto(_packet(fmt.AGGREGATE, slot=0, iteration=0), (PS, fmt.PORT))
        state["answers"][0] = lambda it: _packet(fmt.FLUSH, slot=0, iteration=it)
        state["answers"][1] = lambda it: _packet(fmt.FLUSH, slot=1, iteration=it)
        collector.collect(1, timeout_s=5)   # iteration 0's late repeat is not iteration 1's
    finally:
        collector.close()
    assert np.array_equal(total[:360], np.ones(360))
    assert collector.stats.malformed == 4 and collector.stats.late == 1


def test_a_tor_that_never_answers_is_named():
    collector = _collector()
    try:
        with pytest.raises(base.ProtocolError, match="not answered in 0 s"):
            collector.collect(0, timeout_s=0.1)
    finally:
        collector.close()


class _CountingCondition(threading.Condition):
    def __init__(self) -> None:
        super().__init__()
        self.wakeups = 0

    def notify_all(self) -> None:
        self.wakeups += 1
        super().notify_all()


def test_sums_are_taken_a_batch_at_a_time_not_a_datagram_at_a_time(tor):
    """A model's worth of sums (2 racks of 256 slots, what the 8-worker bench gets an
    iteration) wakes collect() a few times: once a datagram, the PS spent more CPU
    on the wake-ups than on the sums."""
    _, sock = tor
    elements = 256 * fmt.STRIDE - 7
    collector = agg.Collector(JOB, elements, [agg.Rack(1, TOR, (0, 1)), agg.Rack(2, TOR, (2,))],
                              bind=PS)
    collector._cond = counting = _CountingCondition()
    try:
        for rack in (1, 2):
            for s in range(fmt.slots(elements)):
                n = fmt.slot_length(elements, s)
                sock.sendto(fmt.header().pack(
                    fmt.const("MAGIC"), fmt.const("VERSION"), fmt.AGGREGATE, fmt.OK, 0, JOB, 0,
                    s, n, 0b11 if rack == 1 else 0b100, rack)
                    + np.full(n, rack << 20, "<i4").tobytes(), (PS, fmt.PORT))
        total, counts, got = collector.collect(0, timeout_s=5)
    finally:
        collector.close()
    assert got.flushed == 0 and got.missing == 0
    assert np.array_equal(total, np.full(elements, 3 / 16)) and np.all(counts == 3)
    assert counting.wakeups < 128   # ~4 here; a batch per 2 ms however slow the sends


def test_the_last_slot_takes_only_its_own_values_from_a_reused_buffer(tor):
    """A batch's rows are reused: the short last slot read into a row that held a
    whole slot before must not take that slot's tail."""
    _, sock = tor
    collector = _collector()
    try:
        full = np.full(360, 7 << 24, "<i4")
        sock.sendto(_packet(fmt.AGGREGATE, slot=0, values=full), (PS, fmt.PORT))
        deadline = time.monotonic() + 5
        while collector.stats.forwarded < 1 and time.monotonic() < deadline:
            time.sleep(0.005)   # taken by the thread: its own batch
        sock.sendto(_packet(fmt.AGGREGATE, slot=1, values=np.full(40, 1 << 24, "<i4")),
                    (PS, fmt.PORT))
        total, counts, _ = collector.collect(0, timeout_s=5)
    finally:
        collector.close()
    assert np.array_equal(total, np.r_[np.full(360, 7.0), np.ones(40)])
    assert np.array_equal(counts, np.full(ELEMENTS, 2.0))


def test_a_sum_past_the_tors_ring_is_refused(tor):
    _, sock = tor
    collector = _collector()
    try:
        sock.sendto(_packet(fmt.AGGREGATE, slot=0, iteration=fmt.const("RING")),
                    (PS, fmt.PORT))
        for s in (0, 1):
            sock.sendto(_packet(fmt.AGGREGATE, slot=s), (PS, fmt.PORT))
        _, _, got = collector.collect(0, timeout_s=5)
    finally:
        collector.close()
    assert got.flushed == 0 and collector.stats.malformed == 1


def test_a_senders_fixed_point_is_to_fixed_of_its_clipped_gradient_bit_for_bit():
    """The sender converts in a reused buffer: the same s32 as fmt.to_fixed, ties
    rounded to even, clipped values counted, from float32 and float64 gradients."""
    rng = np.random.default_rng(5)
    sender = agg.Sender("127.0.0.1", JOB, 0, ELEMENTS, rack_size=4)
    try:
        for dtype in (np.float32, np.float64):
            grad = (rng.standard_normal(ELEMENTS) * 4).astype(dtype)
            grad[:4] = [0.5 / 2 ** 24, 1.5 / 2 ** 24, -2.5 / 2 ** 24, 40.0]   # ties; clipped
            before = sender.saturated
            clipped = np.clip(grad, -sender.limit, sender.limit)
            expected, _ = fmt.to_fixed(clipped)
            assert np.array_equal(sender.fixed(grad).astype("<i4"), expected)
            assert sender.saturated - before == np.count_nonzero(clipped != grad) > 0
    finally:
        sender.close()


@pytest.mark.netns
def test_with_the_path_down_a_workers_adds_are_lost_not_its_end(no_route: str) -> None:
    """ENETUNREACH (its link removed for a moment by a restarting node agent): the
    ADDs are lost, which the PS's FLUSH shows and repairs; the worker carries on."""
    from tailcut.net import netns
    with netns.entered(no_route):
        worker = agg.Sender("10.77.0.1", job=7, worker=1, elements=1000, rack_size=4)
    try:
        worker.send(0, np.ones(1000, np.float32))
        assert worker.unsent == fmt.slots(1000) and worker.packets == 0
    finally:
        worker.close()
