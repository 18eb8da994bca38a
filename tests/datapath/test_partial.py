"""The XDP partial-delivery counter counts each packet slot once, fires once per message
at p, refuses hostile packets by reason, and leaves nothing attached."""

import socket
import struct
import time
from collections.abc import Iterator

import numpy as np
import pytest

from tailcut.datapath import bpfsys, partial
from tailcut.errors import DatapathError
from tailcut.net import netns
from tailcut.transports import wire
from tests.datapath.frames import udp_frame
from tests.datapath.udp_link import (IFNAME, RECEIVER_IP, SO_RCVBUFFORCE, Link, build_link,
                                     remove_link)

pytestmark = pytest.mark.bpf

PORT = 47000
JOB = wire.job_id("bl-test")
STRIDE = 360
XDP_PASS = 2


@pytest.fixture(scope="module")
def program() -> Iterator[partial.bcc.Program]:
    prog = partial.load(port=PORT, job=JOB, p=0.5, stride=STRIDE)
    try:
        yield prog
    finally:
        prog.close()


def run(prog: partial.bcc.Program, payload: bytes, **frame: object) -> int:
    verdict, _ = bpfsys.test_run(prog.fds[partial.FUNCTION], udp_frame(payload, PORT, **frame))
    return verdict


def stats(prog: partial.bcc.Program) -> dict[str, int]:
    table = prog.table(partial.STATS_MAP)
    return {n: sum(int(v) for v in table[table.Key(i)]) for i, n in enumerate(partial.reasons())}


def events(prog: partial.bcc.Program) -> list[object]:
    """The list the program's ring buffer events are appended to (opened once: BCC
    refuses a second callback on one ring buffer)."""
    if not hasattr(prog, "test_events"):
        got: list[object] = []
        table = prog.table(partial.EVENTS_MAP)
        table.open_ring_buffer(lambda _c, data, _s: got.append(table.event(data)))
        prog.test_events = got
    prog.bpf.ring_buffer_poll(0)
    return prog.test_events


def message_packets(message: int, total: int = 1000, job: int = JOB) -> list[bytes]:
    values = np.arange(total, dtype=np.float32)
    return list(wire.packets(values, job=job, message=message, stride=STRIDE))


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def test_each_slot_is_counted_once_and_the_event_fires_once_at_p(program) -> None:
    got = events(program)  # opens the ring buffer; drains older events
    got.clear()
    pkts = message_packets(101)  # 1000 elements: 360 + 360 + 280
    before = stats(program)
    assert all(run(program, p) == XDP_PASS for p in pkts + pkts + pkts[:1])
    program.bpf.ring_buffer_poll(0)
    assert delta(before, stats(program)) == {"counted": 3, "duplicate": 4}
    fired = [e for e in got if e.message == 101]
    assert len(fired) == 1
    # p = 0.5: threshold 500 elements, crossed by the second packet (720).
    assert (fired[0].counted, fired[0].total, fired[0].slot) == (720, 1000, 1)
    table = program.table(partial.MESSAGES_MAP)
    st = table[table.Key(JOB, 101, PORT)]
    assert (st.counted, st.packets, st.duplicates, st.threshold) == (1000, 3, 4, 500)


def test_a_udp_gso_message_arriving_whole_is_counted_datagram_by_datagram(program) -> None:
    """A sender's UDP GSO message (datagrams back to back under one UDP header), as
    generic XDP sees it when no hop cut it: every datagram is counted on its own, and
    the event fires at the datagram that crosses p."""
    got = events(program)
    got.clear()
    # 760 elements: 360 + 360 + 40, what fits the page BPF_PROG_TEST_RUN gives XDP
    pkts = message_packets(110, total=760)
    before = stats(program)
    assert run(program, b"".join(pkts)) == XDP_PASS
    program.bpf.ring_buffer_poll(0)
    assert delta(before, stats(program)) == {"counted": 3}
    fired = [e for e in got if e.message == 110]
    assert [(e.counted, e.slot) for e in fired] == [(720, 1)]
    table = program.table(partial.MESSAGES_MAP)
    assert table[table.Key(JOB, 110, PORT)].counted == 760


def test_a_gso_message_is_walked_only_up_to_its_first_bad_datagram(program) -> None:
    """A hostile datagram inside a GSO message ends the walk: it gets its reason, and
    what follows it (which no sender of ours makes) gets none."""
    pkts = message_packets(111, total=760)
    bad = hostile(pkts[1])["bad_magic"]
    before = stats(program)
    run(program, pkts[0] + bad + pkts[2])
    assert delta(before, stats(program)) == {"counted": 1, "bad_magic": 1}


def hostile(base: bytes) -> dict[str, bytes]:
    """One bad packet per verdict, each derived from the good packet `base`."""
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
        "bad_range": with_(end=h.start),
        "bad_length": base[:-2],
        "misaligned": with_(start=h.start + 1, end=h.end + 1),
        "unknown_job": with_(job=JOB ^ 1),
    }


@pytest.mark.parametrize("reason", ["short", "bad_magic", "bad_version", "bad_flags",
                                    "bad_range", "bad_length", "misaligned", "unknown_job"])
def test_a_hostile_packet_is_passed_and_counted_under_its_reason_only(program, reason) -> None:
    packet = hostile(message_packets(202)[0])[reason]
    before = stats(program)
    assert run(program, packet) == XDP_PASS
    assert delta(before, stats(program)) == {reason: 1}


def test_end_beyond_total_is_a_bad_range(program) -> None:
    h = wire.header_type().from_buffer_copy(message_packets(203)[0][:wire.HEADER_BYTES])
    h.end, h.total = 400, 300
    before = stats(program)
    run(program, bytes(h) + bytes(4 * (400 - h.start)))
    assert delta(before, stats(program)) == {"bad_range": 1}


def test_a_udp_length_larger_than_the_packet_is_short(program) -> None:
    packet = message_packets(204)[0]
    before = stats(program)
    run(program, packet, udp_len=8 + len(packet) + 100)
    assert delta(before, stats(program)) == {"short": 1}


def test_a_changed_total_is_refused_after_the_first_packet(program) -> None:
    first, *_ = message_packets(205, total=1000)
    other = message_packets(205, total=5000)[1]
    before = stats(program)
    run(program, first)
    run(program, other)
    assert delta(before, stats(program)) == {"counted": 1, "total_mismatch": 1}


def test_packets_to_other_ports_or_protocols_are_not_looked_at(program) -> None:
    before = stats(program)
    verdict, _ = bpfsys.test_run(program.fds[partial.FUNCTION],
                                 udp_frame(message_packets(206)[0], PORT + 1))
    assert verdict == XDP_PASS
    assert verdict == XDP_PASS and delta(before, stats(program)) == {}


def test_ip_options_and_fragments_are_handled(program) -> None:
    before = stats(program)
    run(program, message_packets(207)[0], ihl=7)
    run(program, message_packets(208)[0], frag_off=0x2000)  # more fragments: skipped
    assert delta(before, stats(program)) == {"counted": 1}


def test_random_bytes_never_count(program) -> None:
    rng = np.random.default_rng(3)
    before = stats(program)
    for _ in range(2000):
        n = int(rng.integers(0, 1500))
        run(program, rng.bytes(n))
    after = delta(before, stats(program))
    assert after.get("counted", 0) == 0 and after.get("duplicate", 0) == 0


def test_a_duplicate_flood_counts_once(program) -> None:
    pkt = message_packets(209)[0]
    before = stats(program)
    verdict, _ = bpfsys.test_run(program.fds[partial.FUNCTION], udp_frame(pkt, PORT),
                                 repeat=10_000)
    assert verdict == XDP_PASS
    assert delta(before, stats(program)) == {"counted": 1, "duplicate": 9_999}


def test_the_message_table_fills_up_without_failing(program) -> None:
    table = program.table(partial.MESSAGES_MAP)
    table.clear()
    limit = wire.const("MESSAGES")
    before = stats(program)
    for m in range(limit + 10):
        run(program, message_packets(10_000 + m, total=10)[0])
    assert delta(before, stats(program)) == {"counted": limit, "table_full": 10}
    table.clear()


def test_p_outside_zero_one_is_refused_naming_p() -> None:
    for bad in (0, -0.1, 1.5, True):
        with pytest.raises(ValueError, match=r"p=.*must be a fraction in \(0, 1\]"):
            partial.p_ppm(bad)


def test_one_compiled_program_serves_receivers_added_at_run_time(program) -> None:
    """p, the job and the port are entries of bl_receivers, not compile-time constants:
    a second receiver (another port, another job, another p) is served by the same
    program, each message counted under its own port and threshold; changing p needs
    no compile; a port no longer served is not looked at."""
    other_port, other_job = PORT + 7, wire.job_id("bl-other")
    got = events(program)
    got.clear()
    partial.serve(program, port=other_port, job=other_job, p=1.0)
    try:
        before = stats(program)
        pkts = message_packets(301, job=other_job)   # 360 + 360 + 280 elements
        for pkt in pkts[:2]:
            bpfsys.test_run(program.fds[partial.FUNCTION], udp_frame(pkt, other_port))
        program.bpf.ring_buffer_poll(0)
        assert not [e for e in got if e.message == 301], "p = 1: not before the last packet"
        bpfsys.test_run(program.fds[partial.FUNCTION], udp_frame(pkts[2], other_port))
        program.bpf.ring_buffer_poll(0)
        (fired,) = [e for e in got if e.message == 301]
        assert (fired.counted, fired.port, fired.job) == (1000, other_port, other_job)
        # The first receiver's job sent to the second's port: not its job there.
        bpfsys.test_run(program.fds[partial.FUNCTION],
                        udp_frame(message_packets(302)[0], other_port))
        assert delta(before, stats(program)) == {"counted": 3, "unknown_job": 1}
        table = program.table(partial.MESSAGES_MAP)
        assert int(table[table.Key(other_job, 301, other_port)].counted) == 1000

        partial.serve(program, port=other_port, job=other_job, p=0.2)   # no compile
        for pkt in message_packets(303, job=other_job)[:1]:
            bpfsys.test_run(program.fds[partial.FUNCTION], udp_frame(pkt, other_port))
        program.bpf.ring_buffer_poll(0)
        assert [e.counted for e in got if e.message == 303] == [360]   # 360 >= 200
    finally:
        partial.stop_serving(program, other_port)
    before = stats(program)
    run_other = bpfsys.test_run(program.fds[partial.FUNCTION],
                                udp_frame(message_packets(304, job=other_job)[0], other_port))
    assert run_other[0] == XDP_PASS and delta(before, stats(program)) == {}
    table = program.table(partial.MESSAGES_MAP)
    assert not [k for k in table.keys() if int(k.port) == other_port]


def test_a_receivers_settings_are_checked_before_the_map_is_written(program) -> None:
    with pytest.raises(ValueError, match="port=0"):
        partial.serve(program, port=0, job=JOB, p=0.5)
    with pytest.raises(ValueError, match="job="):
        partial.serve(program, port=PORT, job=2**32, p=0.5)
    with pytest.raises(ValueError, match="p="):
        partial.serve(program, port=PORT, job=JOB, p=0)
    table = program.table(partial.RECEIVERS_MAP)
    assert int(table[table.Key(PORT)].p_ppm) == 500_000   # untouched


# ---- on a live veth: the probe check --------------------------------------------------


@pytest.fixture
def link() -> Iterator[Link]:
    built = build_link("x")
    try:
        yield built
    finally:
        remove_link(built)


def xdp_attached(ns: str) -> object:
    with netns.ipr(ns) as ipr:
        index = ipr.link_lookup(ifname=IFNAME)[0]
        return ipr.get_links(index)[0].get_nested("IFLA_XDP", "IFLA_XDP_ATTACHED")


@pytest.mark.netns
@pytest.mark.parametrize("mode", ["generic", "native"])
def test_23_messages_sent_are_23_counted(link: Link, mode: str) -> None:
    """Send 23 messages (every packet twice, in shuffled order) through a real veth; the
    counter must report 23 crossings, each message fully and once."""
    counter = partial.attach(IFNAME, port=PORT, job=JOB, p=0.9, stride=STRIDE, mode=mode,
                             netns_name=link.receiver)
    try:
        assert xdp_attached(link.receiver) == partial.XDP_ATTACHED[mode]
        with netns.entered(link.receiver):
            rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with netns.entered(link.sender):
            tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)  # hold all 414
        rx.bind((RECEIVER_IP, PORT))
        rng = np.random.default_rng(23)
        received = 0
        try:
            for m in range(23):
                pkts = message_packets(5000 + m, total=3000)  # 9 packets
                order = rng.permutation(len(pkts) * 2) % len(pkts)
                for i in order:
                    tx.sendto(pkts[i], (RECEIVER_IP, PORT))
            rx.settimeout(1.0)
            while received < 23 * 18:
                rx.recv(2048)
                received += 1
        finally:
            rx.close()
            tx.close()
        found: list[partial.Event] = []
        deadline = time.monotonic() + 2
        while len(found) < 23 and time.monotonic() < deadline:
            found += counter.poll(50)
        assert sorted(e.message for e in found) == list(range(5000, 5023))
        assert all(e.total == 3000 and e.counted >= 2700 for e in found)
        for m in range(5000, 5023):
            st = counter.state(m, JOB)
            assert st is not None
            assert (st["counted"], st["packets"], st["duplicates"]) == (3000, 9, 9)
        s = counter.stats()
        assert (s["counted"], s["duplicate"]) == (23 * 9, 23 * 9)
        assert received == 23 * 18  # XDP_PASS: the socket got every packet too
    finally:
        counter.detach()
    assert not xdp_attached(link.receiver)
    counter.detach()  # twice is harmless


@pytest.mark.netns
def test_attaching_twice_to_one_interface_is_refused(link: Link) -> None:
    with partial.attach(IFNAME, port=PORT, job=JOB, p=0.9, stride=STRIDE,
                        netns_name=link.receiver):
        with pytest.raises(DatapathError, match="already has an XDP program"):
            partial.attach(IFNAME, port=PORT, job=JOB, p=0.9, stride=STRIDE,
                           netns_name=link.receiver)
    assert not xdp_attached(link.receiver)


@pytest.mark.netns
def test_detach_after_the_namespace_is_gone_is_harmless() -> None:
    built = build_link("y")
    counter = partial.attach(IFNAME, port=PORT, job=JOB, p=0.9, stride=STRIDE,
                             netns_name=built.receiver)
    remove_link(built)
    time.sleep(0.2)
    counter.detach()


def test_the_header_view_matches_the_c_layout() -> None:
    """wire.py builds its view from partial.h; BCC compiles the same struct (its size is
    asserted in C), so the two agree if the sizes and field order do."""
    names = wire.field_names()
    assert names == ["magic", "version", "flags", "kind", "reserved", "job", "message",
                     "seq", "start", "end", "total"]
    assert wire.HEADER_BYTES == 32 and struct.calcsize("!IBBBBIIIIII") == 32


def test_the_counter_compiles_for_a_9000_byte_mtus_stride_and_refuses_past_its_bound() -> None:
    stride = wire.elements_per_packet(9000)
    assert stride == 2235 <= partial.MAX_STRIDE
    with pytest.raises(ValueError, match="stride=4097: elements per packet must be in 1..4096"):
        partial.compile_program(partial.MAX_STRIDE + 1)
    partial.compile_program(stride).close()


@pytest.mark.parametrize("mtu", [576, 592, 1420, 1500, 4000, 9000])
def test_the_counter_loads_for_the_stride_of_every_kind_of_mtu(mtu: int) -> None:
    """The walk over a GSO message's datagrams stays within what the verifier checks
    (every packet offset under 64 KiB) for short, odd and jumbo MTUs alike."""
    prog = partial.load(port=PORT + 20, job=JOB, p=0.5, stride=wire.elements_per_packet(mtu))
    prog.close()


def test_a_datagram_a_few_bytes_longer_than_a_full_one_gets_one_verdict(program) -> None:
    """Not a GSO message (its tail could not hold a datagram): short, and nothing counted."""
    full = message_packets(112, total=2 * STRIDE)[0]
    before = stats(program)
    run(program, full + b"\0\0\0")
    assert delta(before, stats(program)) == {"short": 1}
