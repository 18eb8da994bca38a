"""In-network aggregation at a ToR (ebpf/agg.bpf.c): every hostile packet dropped with its
one reason and no write; a rack's ADDs summed exactly and the last one turned into the
AGGREGATE for the PS; a FLUSH answered with whoever is in, closing the iteration; the
ring of three iterations moving on. Whole runs over a real fabric are in
tests/runtime/test_in_network_aggregation.py."""

import contextlib
import struct

import numpy as np
import pytest

from tailcut.datapath import agg, bpfsys
from tailcut.datapath import aggformat as fmt
from tailcut.transports import agg as wire_agg
from tests.datapath.frames import _checksum, udp_frame

pytestmark = [pytest.mark.bpf]

JOB = 0x1234ABCD
TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT = 0, 2, 7
TC_ACT_UNSPEC = 0xFFFFFFFF   # -1 as the test run's u32: on to the port's next filter
ELEMENTS = 400          # two slots: 360 and 40
ADDRESS, PS = "10.99.0.2", "10.99.0.7"
NEXT_HOP = "02:00:00:00:00:09"


@contextlib.contextmanager
def _rack():
    with agg.Aggregator(job=JOB, rack=1, members=[0, 1], elements=ELEMENTS, address=ADDRESS,
                        ps_address=PS) as a:
        a.set_next_hop(NEXT_HOP)
        _port(a, "worker", workers=0b1)   # worker 0 only
        yield a


@pytest.fixture
def rack():
    with _rack() as a:
        yield a


@pytest.fixture(scope="module")
def hostile_rack():
    """One aggregator for the hostile packets: each is checked against the state it found
    and must leave it as it was (asserted), so they share one load instead of a BCC
    compile each (about 0.8 s of CPU, several seconds on a busy host)."""
    with _rack() as a:
        yield a


def _port(a, kind: str, workers: int = 0) -> None:
    """Describe port 0: a test run's skb has tc_classid 0."""
    ports = a.program.table("agg_ports")
    leaf = ports.Leaf()
    leaf.kind, leaf.workers = agg._KINDS[kind], workers
    ports[ports.Key(0)] = leaf


def _request(op, *, worker=0, iteration=0, slot=0, values=None, job=JOB, count=None):
    n = fmt.slot_length(ELEMENTS, slot) if slot < fmt.slots(ELEMENTS) else 8
    payload = (np.zeros(n, "<i4") if values is None else values).tobytes()
    data = wire_agg.packet(op, worker=worker, job=job, iteration=iteration, slot=slot,
                           payload=payload)
    if count is not None:
        data = data[:20] + struct.pack(">I", count) + data[24:]
    return data


def _run(a, payload: bytes, **frame):
    return bpfsys.test_run_output(a.program.fds[agg.FUNCTION],
                                  udp_frame(payload, fmt.PORT, dst=ADDRESS, **frame))


def _state(a):
    entries, sums = a.program.table("agg_entries"), a.program.table("agg_sums")
    keys = range(fmt.slots(ELEMENTS) * fmt.const("RING"))
    return ([bytes(entries[entries.Key(k)]) for k in keys],
            [bytes(sums[sums.Key(k)]) for k in keys])


def _delta(before, after):
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def _values(seed: int, n: int = 360) -> np.ndarray:
    return np.random.default_rng(seed).integers(-(1 << 26), 1 << 26, n).astype("<i4")


HOSTILE = {
    "short": lambda: _request(fmt.ADD)[:20],
    "bad_magic": lambda: b"XXXX" + _request(fmt.ADD)[4:],
    "bad_version": lambda: _request(fmt.ADD)[:4] + b"\x09" + _request(fmt.ADD)[5:],
    "bad_op": lambda: _request(fmt.AGGREGATE),          # only the ToR sends those
    "reserved": lambda: _request(fmt.ADD)[:24] + b"\0\0\0\1" + _request(fmt.ADD)[28:],
    "unknown_job": lambda: _request(fmt.ADD, job=JOB + 1),
    "bad_worker": lambda: _request(fmt.ADD, worker=5),   # not in the rack's group
    "wrong_port": lambda: _request(fmt.ADD, worker=1),   # port 0 carries worker 0
    "flush_from_a_worker_port": lambda: _request(fmt.FLUSH, worker=fmt.PS_WORKER),
    "bad_slot": lambda: _request(fmt.ADD, slot=2),
    "bad_count": lambda: _request(fmt.ADD, count=359),
    "bad_length": lambda: _request(fmt.ADD) + b"\0\0\0\0",
    "early": lambda: _request(fmt.ADD, iteration=3, values=_values(0)),
}
REASON = {"reserved": "bad_op", "flush_from_a_worker_port": "wrong_port"}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_packet_is_dropped_with_its_one_reason_and_writes_nothing(hostile_rack, case):
    rack = hostile_rack
    before, state = rack.stats(), _state(rack)
    verdict, _ = _run(rack, HOSTILE[case]())
    assert verdict == TC_ACT_SHOT
    assert _delta(before, rack.stats()) == {REASON.get(case, case): 1}
    assert _state(rack) == state


def test_ip_options_fragments_and_lying_lengths_are_refused(rack):
    for frame, reason in (({"ihl": 6}, "bad_ip"), ({"frag_off": 0x2000}, "bad_ip"),
                          ({"udp_len": 100}, "bad_length")):
        before = rack.stats()
        verdict, _ = _run(rack, _request(fmt.ADD), **frame)
        assert verdict == TC_ACT_SHOT and _delta(before, rack.stats()) == {reason: 1}


def test_random_bytes_never_crash_or_write(rack):
    rng = np.random.default_rng(0)
    state = _state(rack)
    for _ in range(300):
        size = int(rng.integers(0, 1500))
        payload = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        if rng.random() < 0.5 and size >= 4:   # past the magic check
            payload = struct.pack(">I", fmt.const("MAGIC")) + payload[4:]
        verdict, _ = _run(rack, payload)
        assert verdict in (TC_ACT_SHOT, TC_ACT_REDIRECT)
    assert _state(rack) == state


def test_traffic_not_for_the_address_passes_untouched_and_uncounted(rack):
    before = rack.stats()
    for frame in (udp_frame(_request(fmt.ADD), 7000, dst=ADDRESS),
                  udp_frame(_request(fmt.ADD), fmt.PORT, dst="10.99.0.9")):
        verdict, out = bpfsys.test_run_output(rack.program.fds[agg.FUNCTION], frame)
        assert verdict == TC_ACT_UNSPEC and out == frame
    assert rack.stats() == before


def test_the_last_add_of_a_rack_carries_the_exact_sum_to_the_ps(rack):
    a, b = _values(1), _values(2)
    assert _run(rack, _request(fmt.ADD, worker=0, values=a))[0] == TC_ACT_SHOT
    assert _run(rack, _request(fmt.ADD, worker=0, values=a))[0] == TC_ACT_SHOT   # again
    _port(rack, "worker", workers=0b10)
    verdict, out = _run(rack, _request(fmt.ADD, worker=1, values=b))
    assert verdict == TC_ACT_OK   # on into the bridge, toward the next hop
    assert _delta({k: 0 for k in rack.stats()}, rack.stats()) == {
        "added": 1, "duplicate": 1, "forwarded": 1}
    assert out[:6] == bytes.fromhex(NEXT_HOP.replace(":", ""))
    ip = out[14:34]
    assert ip[12:16] == bytes(map(int, ADDRESS.split("."))) and \
        ip[16:20] == bytes(map(int, PS.split(".")))
    assert _checksum(ip) == 0   # still a valid IPv4 header
    assert struct.unpack(">HH", out[34:38]) == (fmt.PORT, fmt.PORT)
    header, values = wire_agg.parse(out[42:])
    assert (header.op, header.status, header.iteration, header.slot, header.members,
            header.rack) == (fmt.AGGREGATE, fmt.OK, 0, 0, 0b11, 1)
    assert np.array_equal(values, a + b)   # exact: integer sums


def test_a_flush_answers_with_whoever_is_in_and_closes_the_iteration(rack):
    a = _values(3, 40)
    assert _run(rack, _request(fmt.ADD, worker=0, slot=1, values=a))[0] == TC_ACT_SHOT
    _port(rack, "ps")
    verdict, out = _run(rack, _request(fmt.FLUSH, worker=fmt.PS_WORKER, slot=1))
    assert verdict == TC_ACT_REDIRECT   # back out of the port it came in on
    header, values = wire_agg.parse(out[42:])
    assert (header.op, header.status, header.iteration, header.members, header.rack) == (
        fmt.FLUSH, fmt.OK, 0, 0b1, 1)
    assert np.array_equal(values, a)
    again = wire_agg.parse(_run(rack, _request(fmt.FLUSH, worker=fmt.PS_WORKER,
                                                slot=1))[1][42:])
    assert again[0].members == 0b1 and np.array_equal(again[1], a)   # a resend: same
    _port(rack, "worker", workers=0b10)
    before = rack.stats()
    assert _run(rack, _request(fmt.ADD, worker=1, slot=1, values=a))[0] == TC_ACT_SHOT
    assert _delta(before, rack.stats()) == {"late": 1}


def test_the_ring_moves_on_and_old_iterations_are_stale(rack):
    _port(rack, "worker", workers=0b11)
    for it in range(4):   # both workers, every iteration: each sum forwarded
        for w in (0, 1):
            _run(rack, _request(fmt.ADD, worker=w, iteration=it, values=_values(10 * it + w)))
    assert rack.stats()["forwarded"] == 4
    _port(rack, "ps")
    header, _ = wire_agg.parse(_run(rack, _request(fmt.FLUSH, worker=fmt.PS_WORKER,
                                                   iteration=1))[1][42:])
    # its entry holds 4 now; the answer names the iteration asked about
    assert (header.status, header.iteration, header.members) == (fmt.STALE, 1, 0)
    # iteration 4's entry was cleared by iteration 2's first ADD: its sum starts at 0
    _port(rack, "worker", workers=0b11)
    a, b = _values(7), _values(8)
    _run(rack, _request(fmt.ADD, worker=0, iteration=4, values=a))
    out = _run(rack, _request(fmt.ADD, worker=1, iteration=4, values=b))[1]
    assert np.array_equal(wire_agg.parse(out[42:])[1], a + b)
    # an iteration whose entry every ADD of two before missed: flushed empty
    _port(rack, "ps")
    header, values = wire_agg.parse(_run(rack, _request(fmt.FLUSH, worker=fmt.PS_WORKER,
                                                        iteration=9))[1][42:])
    assert (header.status, header.members) == (fmt.OK, 0) and not values.any()


def test_without_a_next_hop_a_finished_sum_is_dropped_and_counted(rack):
    rack.set_next_hop(None)
    _port(rack, "worker", workers=0b11)
    _run(rack, _request(fmt.ADD, worker=0, values=_values(1)))
    assert _run(rack, _request(fmt.ADD, worker=1, values=_values(2)))[0] == TC_ACT_SHOT
    assert rack.stats()["no_route"] == 1


def test_a_member_sending_ahead_cannot_clear_an_iteration_still_being_summed(rack):
    _port(rack, "worker", workers=0b11)
    a, b = _values(20), _values(21)
    _run(rack, _request(fmt.ADD, worker=0, iteration=0, values=a))   # worker 1 still due
    # worker 0 runs ahead: iteration 1's entry is ready and takes it, but iteration 3's
    # entry (the one iteration 0 sits in) is not cleared under the sum being made
    _run(rack, _request(fmt.ADD, worker=0, iteration=1, values=_values(22)))
    out = _run(rack, _request(fmt.ADD, worker=1, iteration=0, values=b))[1]
    assert np.array_equal(wire_agg.parse(out[42:])[1], a + b)
