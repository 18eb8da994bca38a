"""The ToR's hot-parameter store (ebpf/tor.bpf.c): every hostile packet dropped with its
one reason and no write; pulls, pushes and counts answered in place; over a real veth,
two workers' pushes folded into the next iteration exactly, in fixed point."""

import contextlib
import struct
import threading
import time

import numpy as np
import pytest

from tailcut.datapath import bpfsys, tor
from tailcut.net import netns
from tailcut.transports import hot
from tests.datapath.frames import udp_frame
from tests.datapath.udp_link import RECEIVER_IP, SENDER_IP

pytestmark = [pytest.mark.bpf]

JOB = 0x1234ABCD
TC_ACT_SHOT, TC_ACT_REDIRECT = 2, 7
TC_ACT_UNSPEC = 0xFFFFFFFF   # -1 as the test run's u32: on to the port's next filter
ELEMENTS = 400   # two slots: 360 and 40


@contextlib.contextmanager
def _store():
    initial = np.linspace(-1, 1, ELEMENTS, dtype=np.float32)
    with tor.Store(job=JOB, workers=2, address="10.99.0.2", initial=initial) as s:
        _port(s, "worker", workers=0b1)   # worker 0 only
        yield s


@pytest.fixture
def store():
    with _store() as s:
        yield s


@pytest.fixture(scope="module")
def hostile_store():
    """One store for the hostile packets: each is checked against the state it found
    and must leave it as it was (asserted), so they share one load instead of a BCC
    compile each (about 0.8 s of CPU, several seconds on a busy host)."""
    with _store() as s:
        yield s


def _port(store, kind: str, workers: int = 0) -> None:
    """Describe port 0: a test run's skb has tc_classid 0."""
    ports = store.program.table("tor_ports")
    leaf = ports.Leaf()
    leaf.kind, leaf.workers = tor._KINDS[kind], workers
    ports[ports.Key(0)] = leaf


def _request(op, *, worker=0, iteration=0, slot=0, values=None, job=JOB, count=None):
    n = hot.slot_length(ELEMENTS, slot) if slot < hot.slots(ELEMENTS) else 8
    payload = (np.zeros(n, "<i4") if values is None else values).tobytes()
    data = hot.packet(op, worker=worker, job=job, iteration=iteration, slot=slot,
                      payload=payload)
    if count is not None:
        data = data[:20] + struct.pack(">I", count) + data[24:]
    return data


def _run(store, payload: bytes, **frame):
    return bpfsys.test_run_output(store.program.fds[tor.FUNCTION],
                                  udp_frame(payload, hot.PORT, **frame))


def _state(store):
    acc = store.program.table("tor_acc")
    return (store.values().tobytes(), store.counts().tobytes(), store.iterations(),
            [bytes(acc[acc.Key(s)]) for s in range(hot.slots(ELEMENTS))])


def _delta(before, after):
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


HOSTILE = {
    "short": lambda: _request(hot.PULL)[:20],
    "bad_magic": lambda: b"XXXX" + _request(hot.PULL)[4:],
    "bad_version": lambda: _request(hot.PULL)[:4] + b"\x09" + _request(hot.PULL)[5:],
    "bad_op": lambda: _request(7),
    "reserved": lambda: _request(hot.PULL)[:24] + b"\0\0\0\1" + _request(hot.PULL)[28:],
    "unknown_job": lambda: _request(hot.PUSH, job=JOB + 1),
    "bad_worker": lambda: _request(hot.PUSH, worker=5),
    "wrong_port": lambda: _request(hot.PUSH, worker=1),            # port 0 carries worker 0
    "bad_slot": lambda: _request(hot.PUSH, slot=2),
    "bad_count": lambda: _request(hot.PUSH, count=359),
    "bad_length": lambda: _request(hot.PUSH) + b"\0\0\0\0",
    "future": lambda: _request(hot.PUSH, iteration=3, values=np.ones(360, "<i4")),
}


@pytest.mark.parametrize("reason", sorted(HOSTILE))
def test_a_hostile_packet_is_dropped_with_its_one_reason_and_writes_nothing(hostile_store,
                                                                           reason):
    store = hostile_store
    before, state = store.stats(), _state(store)
    verdict, _ = _run(store, HOSTILE[reason]())
    assert verdict == TC_ACT_SHOT
    assert _delta(before, store.stats()) == {"bad_op" if reason == "reserved" else reason: 1}
    assert _state(store) == state


def test_the_uplink_carries_only_the_other_racks_workers(store):
    _port(store, "uplink", workers=0b10)   # worker 1 is remote, worker 0 is not
    before = store.stats()
    assert _run(store, _request(hot.PUSH, worker=0))[0] == TC_ACT_SHOT
    assert _delta(before, store.stats()) == {"wrong_port": 1}
    assert _run(store, _request(hot.PULL, worker=1))[0] == TC_ACT_REDIRECT


def test_ip_options_fragments_and_lying_lengths_are_refused(store):
    for frame, reason in (({"ihl": 6}, "bad_ip"), ({"frag_off": 0x2000}, "bad_ip"),
                          ({"udp_len": 100}, "bad_length")):
        before = store.stats()
        verdict, _ = _run(store, _request(hot.PULL), **frame)
        assert verdict == TC_ACT_SHOT and _delta(before, store.stats()) == {reason: 1}


def test_random_bytes_never_crash_or_write(store):
    rng = np.random.default_rng(0)
    state = _state(store)
    for _ in range(300):
        size = int(rng.integers(0, 1500))
        payload = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        if rng.random() < 0.5 and size >= 4:   # past the magic check
            payload = struct.pack(">I", hot.const("MAGIC")) + payload[4:]
        verdict, _ = _run(store, payload)
        assert verdict in (TC_ACT_SHOT, TC_ACT_REDIRECT)
    assert _state(store) == state


def test_traffic_not_for_the_store_passes_untouched_and_uncounted(store):
    before = store.stats()
    frame = udp_frame(_request(hot.PUSH), 7000)
    verdict, out = bpfsys.test_run_output(store.program.fds[tor.FUNCTION], frame)
    assert verdict == TC_ACT_UNSPEC and out == frame   # on to the port's next filter
    other = udp_frame(_request(hot.PUSH), hot.PORT, dst="10.99.0.9")
    assert bpfsys.test_run_output(store.program.fds[tor.FUNCTION], other)[0] == TC_ACT_UNSPEC
    assert store.stats() == before


def test_a_pull_is_answered_in_place_with_the_initial_values(store):
    verdict, out = _run(store, _request(hot.PULL, slot=1))
    assert verdict == TC_ACT_REDIRECT
    header, payload = hot.parse(out[14 + 20 + 8:])
    assert (header.status, header.iteration, header.slot, header.count) == (hot.OK, 0, 1, 40)
    got = hot.from_fixed(np.frombuffer(payload, "<i4"))
    expected = np.linspace(-1, 1, ELEMENTS, dtype=np.float32)[360:]
    assert np.max(np.abs(got - expected)) <= 2 ** -25
    ip = out[14:34]
    assert ip[12:16] == bytes(map(int, RECEIVER_IP.split("."))) and \
        ip[16:20] == bytes(map(int, SENDER_IP.split(".")))   # addresses swapped


def test_pushes_fold_once_every_worker_pushed_and_a_duplicate_adds_nothing(store):
    update = np.full(360, 1 << 20, "<i4")           # 1/16 each
    _port(store, "uplink", workers=0b11)
    assert hot.parse(_run(store, _request(hot.PULL, iteration=1))[1][42:])[0].status == \
        hot.NOT_READY
    for worker in (0, 0, 1):                         # worker 0's push arrives twice
        verdict, out = _run(store, _request(hot.PUSH, worker=worker, values=update))
        assert verdict == TC_ACT_REDIRECT and len(out) == 14 + 20 + 8 + 32   # a bare ACK
    assert store.stats()["duplicate"] == 1 and store.stats()["pushed"] == 2
    assert store.iterations() == [1, 0]              # slot 1 still waits for its pushes
    header, payload = hot.parse(_run(store, _request(hot.PULL, iteration=1))[1][42:])
    got = np.frombuffer(payload, "<i4")
    start = hot.to_fixed(np.linspace(-1, 1, ELEMENTS, dtype=np.float32)[:360])[0]
    assert np.array_equal(got, start + 2 * update)   # exact: integer sums
    late = _run(store, _request(hot.PUSH, worker=1, values=update))[1]
    assert hot.parse(late[42:])[0].status == hot.STALE
    _port(store, "ps")
    header, payload = hot.parse(_run(store, _request(hot.COUNTS, worker=255))[1][42:])
    assert np.array_equal(np.frombuffer(payload, "<u4"), np.full(360, 2))


@pytest.mark.netns
def test_two_workers_over_a_veth_pull_push_and_wait_for_each_other(link):
    initial = np.random.default_rng(1).uniform(-2, 2, 1000).astype(np.float32)
    updates = [np.random.default_rng(2 + w).normal(0, 1e-3, 1000) for w in range(2)]
    with tor.Store(job=JOB, workers=2, address=RECEIVER_IP, initial=initial) as store:
        store.attach(link.receiver, "eth0", "uplink", workers=[0, 1])
        with netns.entered(link.sender):
            clients = [hot.Client(RECEIVER_IP, JOB, w, 1000, timeout_s=10) for w in range(2)]
        try:
            assert np.max(np.abs(clients[0].pull(0) - initial)) <= 2 ** -25
            clients[0].push(0, updates[0])
            pulled = {}

            def early_pull() -> None:        # before worker 1 pushed: NOT_READY, asked again
                pulled["values"] = clients[0].pull(1)
            waiter = threading.Thread(target=early_pull)
            waiter.start()
            time.sleep(0.05)
            assert waiter.is_alive()
            clients[1].push(0, updates[1])
            waiter.join(timeout=10)
            fixed = sum(hot.to_fixed(v)[0].astype(np.int64)
                        for v in (initial, updates[0], updates[1]))
            assert np.array_equal(pulled["values"], hot.from_fixed(fixed))   # exact
            exact = initial.astype(np.float64) + updates[0] + updates[1]
            # three roundings to Q8.24, then one to float32 (half an ulp below 2)
            assert np.max(np.abs(pulled["values"] - exact)) <= 3 * 2 ** -25 + 2 ** -23
            assert clients[0].stats.not_ready > 0
            assert store.stats()["pushed"] == 2 * hot.slots(1000)
            assert store.iterations() == [1, 1, 1]
        finally:
            for c in clients:
                c.close()
    assert store.stats()["pushed"] == 2 * hot.slots(1000)   # readable after detach
