"""The kernel receive path (rxring) places each range of a bound message bit-exact, once,
fires once at p and once at completion, drops hostile datagrams without writing a byte
outside what a well-formed one may, passes what is not its own, and leaves nothing
attached."""

import socket
import struct
import time
from collections.abc import Iterator

import numpy as np
import pytest

from tailcut.datapath import bpfsys, clsact, rxring
from tailcut.errors import DatapathError
from tailcut.net import netns
from tailcut.transports import wire
from tests.datapath.frames import udp_frame
from tests.datapath.udp_link import (IFNAME, RECEIVER_IP, SO_RCVBUFFORCE, Link, build_link,
                                     remove_link)

pytestmark = pytest.mark.bpf

PORT = 47200
JOB = wire.job_id("rx-test")
STRIDE = 360
TC_ACT_SHOT = 2
TC_ACT_UNSPEC = 0xFFFFFFFF   # -1 as BPF_PROG_TEST_RUN reports it
SOL_UDP, UDP_SEGMENT = 17, 103
ETH_P_ALL = 0x0003
DATAGRAM = wire.HEADER_BYTES + 4 * STRIDE


@pytest.fixture(scope="module")
def ring() -> Iterator[rxring.Ring]:
    r = rxring.load(port=PORT, job=JOB, stride=STRIDE, ranges=256, regions=32)
    try:
        yield r
    finally:
        r.detach()


@pytest.fixture
def fresh(ring: rxring.Ring) -> Iterator[rxring.Ring]:
    """The module's ring with nothing bound and no events left over."""
    for m in ring.bound():
        ring.release(m)
    time.sleep(rxring.QUARANTINE_S)   # every region bindable again
    ring.poll(0)
    yield ring
    for m in ring.bound():
        ring.release(m)


def run(ring: rxring.Ring, payload: bytes, port: int = PORT, **frame: object) -> int:
    verdict, _ = bpfsys.test_run(ring.program.fds[rxring.FUNCTION],
                                 udp_frame(payload, port, **frame))
    return verdict


def values_of(total: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(total).astype(np.float32)


def packets(values: np.ndarray, message: int, job: int = JOB) -> list[bytes]:
    return list(wire.packets(values, job=job, message=message, stride=STRIDE))


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def snapshot(ring: rxring.Ring) -> tuple[bytes, bytes]:
    return ring.data.tobytes(), ring.state.tobytes()


# ---- with BPF_PROG_TEST_RUN ------------------------------------------------------------


def test_a_bound_message_is_placed_bit_exact_and_fires_once_at_p_and_once_complete(
        fresh: rxring.Ring) -> None:
    vals = values_of(1000)
    m = fresh.bind(101, 1000, p=0.5)
    pkts = packets(vals, 101)   # 360 + 360 + 280 elements
    before = fresh.stats()
    assert [run(fresh, p) for p in pkts + pkts + pkts[:1]] == [TC_ACT_SHOT] * 7
    assert delta(before, fresh.stats()) == {"placed": 3, "duplicate": 4}
    events = fresh.poll(0)
    # p = 0.5: threshold 500, crossed by the second range (720); then complete at 1000.
    assert [(e.what, e.counted, e.message, e.region) for e in events] == \
        [(rxring.EV_P, 720, 101, m.region), (rxring.EV_COMPLETE, 1000, 101, m.region)]
    assert m.values.tobytes() == vals.tobytes()
    assert m.arrived.tolist() == [True, True, True]
    assert (m.counted, m.packets, m.duplicates, m.fired) == (1000, 3, 4, 3)
    assert not m.values.flags.writeable and not m.arrived.flags.writeable


def test_at_p_1_one_event_says_both(fresh: rxring.Ring) -> None:
    fresh.bind(102, 700, p=1.0)
    for p in packets(values_of(700), 102):
        run(fresh, p)
    assert [e.what for e in fresh.poll(0)] == [rxring.EV_P | rxring.EV_COMPLETE]


def test_a_missing_range_reads_as_zero_and_is_not_in_the_mask(fresh: rxring.Ring) -> None:
    vals = values_of(1000, seed=1)
    m = fresh.bind(103, 1000, p=0.9)
    pkts = packets(vals, 103)
    run(fresh, pkts[0])
    run(fresh, pkts[2])
    assert m.arrived.tolist() == [True, False, True]
    assert not np.any(m.values[360:720])
    mask = m.element_mask()
    assert np.array_equal(m.values[mask], vals[mask])
    assert fresh.poll(0) == []   # 640 < 900


def test_a_region_is_zeroed_when_bound_again(fresh: rxring.Ring) -> None:
    regions = fresh.regions
    first = fresh.bind(104, 1000, p=1.0)
    for p in packets(values_of(1000, seed=2), 104):
        run(fresh, p)
    fresh.release(104)
    # The free list hands out the oldest-free region: cycle until the same one returns.
    for i in range(regions - 1):
        fresh.bind(10_000 + i, 10, p=1.0)
    time.sleep(rxring.QUARANTINE_S)
    again = fresh.bind(105, 1000, p=1.0)
    assert again.region == first.region
    assert not np.any(again.values) and not np.any(again.arrived) and again.counted == 0


def test_a_released_region_is_not_bound_again_at_once(fresh: rxring.Ring) -> None:
    """A placement that checked the old binding and stalled must not land in the next
    message's region: a region released is held back QUARANTINE_S."""
    first = [fresh.bind(20_000 + i, 10, p=1.0) for i in range(fresh.regions)][0]
    fresh.release(20_000)
    with pytest.raises(DatapathError, match="no region has been free"):
        fresh.bind(20_500, 10, p=1.0)
    time.sleep(rxring.QUARANTINE_S)
    assert fresh.bind(20_500, 10, p=1.0).region == first.region


def test_datagrams_of_unbound_messages_other_jobs_and_ports_pass_untouched(
        fresh: rxring.Ring) -> None:
    fresh.bind(106, 1000, p=1.0)
    before, snap = fresh.stats(), snapshot(fresh)
    assert run(fresh, packets(values_of(1000), 107)[0]) == TC_ACT_UNSPEC   # not bound
    assert run(fresh, packets(values_of(1000), 106, job=JOB ^ 1)[0]) == TC_ACT_UNSPEC
    assert run(fresh, packets(values_of(1000), 106)[0], port=PORT + 1) == TC_ACT_UNSPEC
    assert run(fresh, packets(values_of(1000), 106)[0], frag_off=0x2000) == TC_ACT_UNSPEC
    assert delta(before, fresh.stats()) == {"unbound": 1, "unknown_job": 1}
    assert snapshot(fresh) == snap
    fresh.release(106)
    assert run(fresh, packets(values_of(1000), 106)[0]) == TC_ACT_UNSPEC   # released


def hostile(base: bytes) -> dict[str, bytes]:
    """One malformed datagram per reason, each derived from the good datagram `base`
    (the first range of a bound message of 1000 elements, kind PUSH)."""
    h = wire.header_type().from_buffer_copy(base[:wire.HEADER_BYTES])
    payload = base[wire.HEADER_BYTES:]

    def with_(**fields: int) -> bytes:
        copy = wire.header_type().from_buffer_copy(bytes(h))
        for k, v in fields.items():
            setattr(copy, k, v)
        return bytes(copy) + payload

    return {
        "short": base[:20],
        "bad_magic": with_(magic=0xDEADBEEF),
        "bad_version": with_(version=9),
        "bad_flags": with_(flags=0x80),
        "bad_kind": with_(kind=9),            # neither PUSH nor PARAMS
        "bad_range": with_(end=h.start),
        "bad_length": base[:-2],
        "misaligned": with_(start=h.start + 1, end=h.end + 1),
    }


@pytest.mark.parametrize("reason, fields", [("kind_mismatch", {"kind": 3}),
                                            ("total_mismatch", {"total": 2000})])
def test_a_datagram_not_of_the_bound_messages_kind_or_total_goes_to_the_socket(
        fresh: rxring.Ring, reason: str, fields: dict[str, int]) -> None:
    """A binding made ahead of its BEGIN may guess the kind or the total wrong: such a
    datagram is left to the socket (whose receiver checks it), nothing written here."""
    fresh.bind(202, 1000, p=0.5)
    base = packets(values_of(1000), 202)[0]
    h = wire.header_type().from_buffer_copy(base[:wire.HEADER_BYTES])
    for k, v in fields.items():
        setattr(h, k, v)
    before, snap = fresh.stats(), snapshot(fresh)
    assert run(fresh, bytes(h) + base[wire.HEADER_BYTES:]) == TC_ACT_UNSPEC
    assert delta(before, fresh.stats()) == {reason: 1}
    assert snapshot(fresh) == snap


def test_a_datagram_from_another_source_than_the_bound_peers_goes_to_the_socket(
        fresh: rxring.Ring) -> None:
    """A message bound with its peer's address takes its datagrams from there only:
    another host's copy of a range is left to the socket (whose receiver refuses it),
    so it can neither write a value nor make the real datagram a duplicate."""
    from tailcut.transports import batch
    fresh.bind(203, 1000, p=0.5, source=batch.ipv4("10.99.0.7"))
    first = packets(values_of(1000), 203)[0]
    before, snap = fresh.stats(), snapshot(fresh)
    assert run(fresh, first, src="10.99.0.8") == TC_ACT_UNSPEC
    assert delta(before, fresh.stats()) == {"foreign_source": 1}
    assert snapshot(fresh) == snap
    assert run(fresh, first, src="10.99.0.7") == TC_ACT_SHOT
    assert delta(before, fresh.stats()) == {"foreign_source": 1, "placed": 1}


@pytest.mark.parametrize("reason", ["short", "bad_magic", "bad_version", "bad_flags",
                                    "bad_kind", "bad_range", "bad_length", "misaligned"])
def test_a_malformed_datagram_is_dropped_and_counted_without_a_write(
        fresh: rxring.Ring, reason: str) -> None:
    fresh.bind(201, 1000, p=0.5)
    packet = hostile(packets(values_of(1000), 201)[0])[reason]
    before, snap = fresh.stats(), snapshot(fresh)
    assert run(fresh, packet) == TC_ACT_SHOT
    assert delta(before, fresh.stats()) == {reason: 1}
    assert snapshot(fresh) == snap


def test_every_malformed_reason_has_a_case() -> None:
    assert set(rxring.malformed()) == set(hostile(packets(values_of(1000), 1)[0])) | \
        {"out_of_range"}


def test_a_range_past_the_regions_buffer_is_refused_even_if_the_map_says_otherwise(
        fresh: rxring.Ring) -> None:
    """A total bigger than the region cannot be bound; and if the writable state map
    is made to claim one, the program's own bound still refuses the write."""
    with pytest.raises(ValueError, match="total=92161: a region holds 1..92160"):
        fresh.bind(300, fresh.capacity + 1, p=1.0)
    m = fresh.bind(301, 1000, p=1.0)
    huge = fresh.capacity + 10 * STRIDE
    fresh._state["total"][m.region] = huge   # a hostile writer of the map
    h = wire.header_type()(magic=wire.MAGIC, version=wire.VERSION, kind=2, job=JOB,
                           message=301, start=fresh.capacity, end=fresh.capacity + STRIDE,
                           total=huge)
    before, snap = fresh.stats(), snapshot(fresh)
    assert run(fresh, bytes(h) + bytes(4 * STRIDE)) == TC_ACT_SHOT
    assert delta(before, fresh.stats()) == {"out_of_range": 1}
    assert snapshot(fresh) == snap


def test_a_udp_length_past_the_packet_is_short(fresh: rxring.Ring) -> None:
    fresh.bind(302, 1000, p=1.0)
    pkt = packets(values_of(1000), 302)[0]
    before = fresh.stats()
    assert run(fresh, pkt, udp_len=8 + len(pkt) + 100) == TC_ACT_SHOT
    assert delta(before, fresh.stats()) == {"short": 1}


def test_datagrams_back_to_back_without_gso_metadata_are_one_bad_length(
        fresh: rxring.Ring) -> None:
    """Without gso_size an skb holds one datagram: two glued together are one datagram
    longer than any this stride makes, dropped without a write."""
    fresh.bind(303, 1000, p=1.0)
    pkts = packets(values_of(1000), 303)
    before, snap = fresh.stats(), snapshot(fresh)
    assert run(fresh, pkts[0] + pkts[1]) == TC_ACT_SHOT
    assert delta(before, fresh.stats()) == {"bad_length": 1}
    assert snapshot(fresh) == snap


def test_random_bytes_never_write(fresh: rxring.Ring) -> None:
    fresh.bind(304, 1000, p=1.0)
    rng = np.random.default_rng(3)
    before, snap = fresh.stats(), snapshot(fresh)
    for _ in range(2000):
        verdict = run(fresh, rng.bytes(int(rng.integers(0, 1500))))
        assert verdict in (TC_ACT_SHOT, TC_ACT_UNSPEC)
    after = delta(before, fresh.stats())
    assert not after.get("placed") and not after.get("duplicate")
    assert snapshot(fresh) == snap


def test_mutated_headers_write_only_whole_ranges_of_the_bound_message(
        fresh: rxring.Ring) -> None:
    """Fuzz: good datagrams of a bound message with header fields set to edge values
    and lengths cut or grown. Whatever is accepted lands in a whole range of that
    message's region; every byte of every other region, past the message's total and
    in every range not marked arrived stays as it was, and the count agrees with the
    mask."""
    total = 5000   # 14 ranges, the last of 320
    m = fresh.bind(305, total, p=1.0)
    other = fresh.bind(306, total, p=1.0)
    base = packets(values_of(total, seed=5), 305)
    fields = wire.field_names()
    rng = np.random.default_rng(7)
    edges = [0, 1, 2, 3, STRIDE - 1, STRIDE, STRIDE + 1, total - 1, total, total + 1,
             fresh.capacity, fresh.capacity + STRIDE, 2**31, 2**32 - 1]
    data_before, state_before = fresh.data.copy(), fresh.state.copy()
    for _ in range(3000):
        pkt = bytearray(base[int(rng.integers(len(base)))])
        h = wire.header_type().from_buffer_copy(bytes(pkt[:wire.HEADER_BYTES]))
        for name in rng.choice(fields, size=int(rng.integers(1, 4)), replace=False):
            width = 8 * (getattr(type(h), str(name)).size)
            value = int(rng.choice(edges)) if rng.random() < 0.7 else \
                int(rng.integers(0, 2**width))
            setattr(h, str(name), value % 2**width)
        pkt[:wire.HEADER_BYTES] = bytes(h)
        cut = int(rng.integers(-8, 9)) if rng.random() < 0.3 else 0
        pkt = pkt[:len(pkt) + cut] if cut < 0 else pkt + bytes(cut)
        assert run(fresh, bytes(pkt)) in (TC_ACT_SHOT, TC_ACT_UNSPEC)
    untouched = [r for r in range(fresh.regions) if r != m.region]
    assert np.array_equal(fresh.data[untouched].view(np.uint32),
                          data_before[untouched].view(np.uint32))
    assert fresh.state[untouched].tobytes() == state_before[untouched].tobytes()
    assert other.counted == 0
    assert not np.any(fresh.data[m.region].reshape(-1)[total:].view(np.uint32))
    mask = m.element_mask()
    assert not np.any(m.values[~mask].view(np.uint32))
    lengths = np.minimum(STRIDE, total - STRIDE * np.arange(m.ranges))
    assert m.counted == int(lengths[m.arrived].sum())


def test_the_program_loads_for_short_and_jumbo_strides_and_the_largest_region() -> None:
    """The verifier's bounds hold at the edges: a 576-byte MTU's stride, a 9000-byte
    one's, and the most ranges a region may have."""
    for stride, ranges in ((wire.elements_per_packet(576), 64),
                           (wire.elements_per_packet(9000), 64), (STRIDE, rxring.MAX_RANGES)):
        rxring.compile_program(stride, ranges, regions=1).close()
    with pytest.raises(ValueError, match="ranges=100: packets per region must be a multiple"):
        rxring.compile_program(STRIDE, 100, 1)


def test_binding_is_checked(fresh: rxring.Ring) -> None:
    fresh.bind(400, 10, p=1.0)
    with pytest.raises(Exception, match="bound already"):
        fresh.bind(400, 10, p=1.0)
    with pytest.raises(ValueError, match="kind=4"):
        fresh.bind(401, 10, p=1.0, kind=4)
    with pytest.raises(ValueError, match="p=0"):
        fresh.bind(402, 10, p=0)


# ---- on a live veth ---------------------------------------------------------------------


@pytest.fixture
def link() -> Iterator[Link]:
    built = build_link("r")
    try:
        yield built
    finally:
        remove_link(built)


def ingress_filters(ns: str) -> tuple[int, bool]:
    """(BPF filters on the interface's ingress, whether it has a clsact qdisc)."""
    with netns.ipr(ns) as ipr:
        index = ipr.link_lookup(ifname=IFNAME)[0]
        has_clsact = any(q.get_attr("TCA_KIND") == "clsact" for q in ipr.get_qdiscs(index))
        if not has_clsact:
            return 0, False
        return (sum(1 for f in ipr.get_filters(index, parent=clsact.PARENTS["ingress"])
                    if f["handle"]), True)


def rx_packets(ns: str) -> int:
    with netns.ipr(ns) as ipr:
        link = ipr.get_links(ipr.link_lookup(ifname=IFNAME)[0])[0]
        return int(link.get_attr("IFLA_STATS64")["rx_packets"])


def send_gso(tx: socket.socket, pkts: list[bytes], order: np.ndarray, per: int = 22) -> int:
    """Send `pkts` in `order` as UDP GSO messages of up to `per` full datagrams (a short
    one goes alone: only a GSO message's last datagram may be shorter); returns sends."""
    full = [int(i) for i in order if len(pkts[i]) == DATAGRAM]
    short = [int(i) for i in order if len(pkts[i]) != DATAGRAM]
    sends = 0
    for first in range(0, len(full), per):
        group = full[first:first + per]
        tx.sendmsg([b"".join(pkts[i] for i in group)],
                   [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", DATAGRAM))], 0,
                   (RECEIVER_IP, PORT))
        sends += 1
    for i in short:
        tx.sendto(pkts[i], (RECEIVER_IP, PORT))
        sends += 1
    return sends


@pytest.mark.netns
def test_23_messages_over_a_veth_arrive_bit_exact_and_fire_once_each_at_p(link: Link) -> None:
    """23 quickstart-sized messages (64,800 floats, 180 datagrams each), sent as UDP GSO
    in shuffled order with a second pass of duplicates: each lands bit-exact in its
    region, fires once at p and once complete, and the socket gets none of them."""
    ring = rxring.attach(link.receiver, IFNAME, port=PORT, job=JOB, stride=STRIDE,
                         ranges=256, regions=32)
    try:
        assert ingress_filters(link.receiver) == (1, True)
        with netns.entered(link.receiver):
            rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with netns.entered(link.sender):
            tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
        rx.bind((RECEIVER_IP, PORT))
        rng = np.random.default_rng(23)
        total, sent, sends = 64_800, {}, 0
        packets_before = rx_packets(link.receiver)
        try:
            for i in range(23):
                message = (1 << 16) | i
                sent[message] = values_of(total, seed=100 + i)
                ring.bind(message, total, p=0.9)
                pkts = packets(sent[message], message)
                sends += send_gso(tx, pkts, rng.permutation(len(pkts)))
                sends += send_gso(tx, pkts, rng.permutation(len(pkts))[:20])  # duplicates
            events: list[rxring.Event] = []
            deadline = time.monotonic() + 5
            while sum(e.complete for e in events) < 23 and time.monotonic() < deadline:
                events += ring.poll(50)
            rx.setblocking(False)
            with pytest.raises(BlockingIOError):
                rx.recv(2048)   # every datagram was taken before the socket
        finally:
            rx.close()
            tx.close()
        at_p = sorted(e.message for e in events if e.at_p)
        complete = sorted(e.message for e in events if e.complete)
        assert at_p == complete == sorted(sent)
        assert all(e.counted >= 58_320 and e.total == total for e in events if e.at_p)
        for message, vals in sent.items():
            m = ring.message(message)
            assert m.values.tobytes() == vals.tobytes()
            assert m.arrived.all() and (m.packets, m.duplicates) == (180, 20)
        s = ring.stats()
        assert (s["placed"], s["duplicate"]) == (23 * 180, 23 * 20)
        assert sum(s.values()) == 23 * 200   # nothing else was seen
        # GSO kept whole to the hook: the interface received one skb per send.
        assert rx_packets(link.receiver) - packets_before == sends < 23 * 200
    finally:
        ring.detach()
    assert ingress_filters(link.receiver) == (0, False)
    ring.detach()   # twice is harmless


@pytest.mark.netns
def test_malformed_datagrams_over_a_veth_are_dropped_and_unbound_ones_reach_the_socket(
        link: Link) -> None:
    ring = rxring.attach(link.receiver, IFNAME, port=PORT, job=JOB, stride=STRIDE,
                         ranges=256, regions=4)
    try:
        ring.bind(500, 1000, p=1.0)
        with netns.entered(link.receiver):
            rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with netns.entered(link.sender):
            tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rx.bind((RECEIVER_IP, PORT))
        rx.settimeout(1.0)
        try:
            snap = snapshot(ring)
            bad = hostile(packets(values_of(1000), 500)[0])
            for pkt in bad.values():
                tx.sendto(pkt, (RECEIVER_IP, PORT))
            unbound = packets(values_of(1000), 501)
            for pkt in unbound:
                tx.sendto(pkt, (RECEIVER_IP, PORT))
            got = [rx.recv(2048) for _ in unbound]
            rx.setblocking(False)
            with pytest.raises(BlockingIOError):
                rx.recv(2048)
        finally:
            rx.close()
            tx.close()
        assert sorted(got) == sorted(unbound)
        assert snapshot(ring) == snap
        s = ring.stats()
        assert {k: v for k, v in s.items() if v} == {**{r: 1 for r in bad}, "unbound": 3}
    finally:
        ring.detach()
    assert ingress_filters(link.receiver) == (0, False)


@pytest.mark.netns
def test_detach_after_the_namespace_is_gone_is_harmless() -> None:
    built = build_link("s")
    ring = rxring.attach(built.receiver, IFNAME, port=PORT, job=JOB, stride=STRIDE,
                         ranges=64, regions=1)
    remove_link(built)
    time.sleep(0.2)
    ring.detach()


def test_an_odd_stride_is_placed_range_by_range_in_padded_rows() -> None:
    """A 576-byte MTU's stride (129) leaves a float of padding after each range: the
    rows are views, the flat vector a copy, and both read what was sent."""
    stride = wire.elements_per_packet(576)
    r = rxring.load(port=PORT, job=JOB, stride=stride, ranges=64, regions=2)
    try:
        vals = values_of(1000, seed=9)
        m = r.bind(600, 1000, p=1.0)
        for pkt in wire.packets(vals, job=JOB, message=600, stride=stride):
            assert run(r, pkt) == TC_ACT_SHOT
        assert m.values.tobytes() == vals.tobytes()
        assert m.rows.base is not None and m.rows[1, :5].tolist() == \
            vals[stride:stride + 5].tolist()
        assert [e.what for e in r.poll(0)] == [rxring.EV_P | rxring.EV_COMPLETE]
    finally:
        r.detach()


@pytest.mark.netns
def test_a_capture_in_the_pod_still_sees_the_datagrams_it_takes(link: Link) -> None:
    """Packet sockets for every protocol (tcpdump's ETH_P_ALL) are served before the
    clsact ingress hook, so a capture in the receiving pod sees what the program then
    drops (one for IPv4 only is served after it, and does not)."""
    ring = rxring.attach(link.receiver, IFNAME, port=PORT, job=JOB, stride=STRIDE,
                         ranges=64, regions=1)
    try:
        with netns.entered(link.receiver):
            tap = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM,
                                socket.htons(ETH_P_ALL))
        with netns.entered(link.sender):
            tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            tap.bind((IFNAME, 0))
            tap.settimeout(1.0)
            vals = values_of(3000, seed=11)
            m = ring.bind(700, 3000, p=1.0)
            pkts = packets(vals, 700)
            send_gso(tx, pkts, np.arange(len(pkts)))
            seen = 0
            while seen < len(b"".join(pkts)):
                frame = tap.recv(1 << 16)
                ihl = 4 * (frame[0] & 0x0F)
                if frame[9] == 17 and struct.unpack_from("!H", frame, ihl + 2)[0] == PORT:
                    seen += len(frame) - ihl - 8
        finally:
            tap.close()
            tx.close()
        assert m.values.tobytes() == vals.tobytes()
    finally:
        ring.detach()


@pytest.mark.netns
def test_it_shares_the_hook_with_a_loss_dropper_which_runs_first(link: Link) -> None:
    """A dropper on the same ingress hook (pref 1) sees every packet first: with loss 1
    nothing reaches the program; either may leave first, and the clsact goes with the
    last of them."""
    from tailcut.datapath import dropper

    ring = rxring.attach(link.receiver, IFNAME, port=PORT, job=JOB, stride=STRIDE,
                         ranges=64, regions=1)
    drop = dropper.attach(link.receiver, IFNAME, 1.0, direction="ingress")
    try:
        assert ingress_filters(link.receiver) == (2, True)
        ring.bind(800, 1000, p=1.0)
        with netns.entered(link.sender):
            tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            for pkt in packets(values_of(1000), 800):
                tx.sendto(pkt, (RECEIVER_IP, PORT))
        finally:
            tx.close()
        time.sleep(0.2)
        assert drop.counts() == (0, 3)
        assert sum(ring.stats().values()) == 0
        ring.detach()
        assert ingress_filters(link.receiver) == (1, True)
    finally:
        ring.detach()
        drop.detach()
    assert ingress_filters(link.receiver) == (0, False)


def test_its_threshold_is_the_transports() -> None:
    """One function (its arithmetic: tests/spec/test_fraction.py), not copies that drift."""
    from tailcut.spec import fraction
    from tailcut.transports import receiver

    assert rxring.threshold_elements is receiver.threshold_elements \
        is fraction.threshold_elements
