"""The bounded-loss wire format: round trips, one rejection per bad field, and a fuzz run
showing the parser never crashes, never reads past the datagram and never accepts a
packet whose range and payload disagree."""

import ctypes

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tailcut.transports import wire

JOB = wire.job_id("bl-wire")


def good(start: int = 0, n: int = 4, total: int = 100, **fields: int) -> bytes:
    values = np.arange(start, start + n, dtype=np.float32)
    return wire.build(job=JOB, message=7, seq=3, start=start, total=total, values=values,
                      **fields)


def with_header(packet: bytes, **fields: int) -> bytes:
    h = wire.header_type().from_buffer_copy(packet[:wire.HEADER_BYTES])
    for name, value in fields.items():
        setattr(h, name, value)
    return bytes(h) + packet[wire.HEADER_BYTES:]


def test_the_header_layout_comes_from_partial_h_and_is_32_bytes() -> None:
    assert wire.HEADER_BYTES == 32
    h = wire.header_type()
    offsets = {name: getattr(h, name).offset for name in wire.field_names()}
    assert offsets == {"magic": 0, "version": 4, "flags": 5, "kind": 6, "reserved": 7,
                       "job": 8, "message": 12, "seq": 16, "start": 20, "end": 24,
                       "total": 28}
    assert issubclass(h, ctypes.BigEndianStructure)


def test_a_1500_byte_mtu_carries_360_floats_per_packet() -> None:
    assert wire.elements_per_packet(1500) == 360
    assert wire.IP_UDP_BYTES + wire.HEADER_BYTES + 4 * 360 == 1500


def test_a_packet_round_trips_and_reads_big_endian() -> None:
    pkt = good(start=8, n=3, total=50, flags=wire.F_RETX)
    assert pkt[:4] == b"TCLB"
    assert pkt[20:24] == (8).to_bytes(4, "big")
    p = wire.parse(pkt)
    assert (p.job, p.message, p.seq, p.start, p.end, p.total, p.flags) == \
        (JOB, 7, 3, 8, 11, 50, wire.F_RETX)
    assert p.values.tolist() == [8.0, 9.0, 10.0]


def test_packets_cover_the_vector_exactly_once_in_whole_floats() -> None:
    values = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    parsed = [wire.parse(p) for p in wire.packets(values, job=JOB, message=1, stride=360)]
    assert [(p.start, p.end) for p in parsed] == [(0, 360), (360, 720), (720, 1000)]
    assert np.array_equal(np.concatenate([p.values for p in parsed]), values)


@pytest.mark.parametrize("packet,words", [
    (good()[:31], "truncated: 31 bytes"),
    (with_header(good(), magic=0x41414141), "magic: 0x41414141"),
    (with_header(good(), version=2), "version: 2"),
    (with_header(good(), flags=0x10), "flags: 0x10 has unknown bits"),
    (with_header(good(), reserved=1), "reserved: 1"),
    (with_header(good(), kind=1), "kind: 1"),
    (with_header(good(), start=4, end=4), "end 4 <= start 4"),
    (with_header(good(), start=5, end=4), "end 4 <= start 5"),
    (with_header(good(start=96, n=4), total=99), "end 100 > total 99"),
    (with_header(good(), total=1 << 30), "exceeds max_elements"),
    (good()[:-2], "not a whole number of float32s"),
    (good()[:-4], "payload: 12 bytes, range [0, 4) needs 16"),
    (good() + b"\0\0\0\0", "payload: 20 bytes"),
])
def test_each_bad_field_is_named(packet: bytes, words: str) -> None:
    with pytest.raises(wire.BadPacket, match=r".*") as caught:
        wire.parse(packet)
    assert words in str(caught.value)


def test_the_job_id_is_the_first_four_bytes_of_sha256() -> None:
    assert wire.job_id("quickstart") == int.from_bytes(
        __import__("hashlib").sha256(b"quickstart").digest()[:4], "big")


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_random_bytes_are_parsed_or_refused_never_crash(data: bytes) -> None:
    try:
        p = wire.parse(data)
    except wire.BadPacket:
        return
    assert p.start < p.end <= p.total and len(p.values) == p.end - p.start
    assert len(data) == wire.HEADER_BYTES + 4 * (p.end - p.start)


header_fields = st.fixed_dictionaries({
    "magic": st.sampled_from([wire.MAGIC, 0, 0xFFFFFFFF]),
    "version": st.sampled_from([wire.VERSION, 0, 255]),
    "flags": st.integers(0, 255), "kind": st.integers(0, 255),
    "reserved": st.sampled_from([0, 0, 1]),
    "job": st.integers(0, 2**32 - 1), "message": st.integers(0, 2**32 - 1),
    "seq": st.integers(0, 2**32 - 1),
    "start": st.integers(0, 2**32 - 1) | st.integers(0, 1000),
    "end": st.integers(0, 2**32 - 1) | st.integers(0, 1000),
    "total": st.integers(0, 2**32 - 1) | st.integers(0, 1000),
})


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(header_fields, st.integers(0, 1500))
def test_fuzzed_headers_are_accepted_only_when_every_field_is_consistent(
        fields: dict[str, int], payload_bytes: int) -> None:
    packet = bytes(wire.header_type()(**fields)) + bytes(payload_bytes)
    try:
        p = wire.parse(packet, max_elements=10_000)
    except wire.BadPacket:
        return
    assert fields["magic"] == wire.MAGIC and fields["version"] == wire.VERSION
    assert fields["flags"] & ~wire.FLAGS == 0 and fields["reserved"] == 0
    assert fields["kind"] in wire.DATA_KINDS
    assert p.start < p.end <= p.total <= 10_000
    assert payload_bytes == 4 * (p.end - p.start) == p.values.nbytes


def test_the_fast_parser_reads_fields_in_the_header_order() -> None:
    assert list(wire._Fields._fields) == wire.field_names()
    assert wire._UNPACK.size == wire.HEADER_BYTES


# ---- check_batch: the receiver's vectorised parser must agree with parse -------------


def verdict(packet: bytes, max_elements: int = wire.DEFAULT_MAX_ELEMENTS) -> str:
    """parse's verdict on one packet, named as check_batch names it."""
    try:
        wire.parse(packet, max_elements)
    except wire.BadPacket as err:
        return str(err).split(":")[0]
    return "ok"


def batch_verdicts(packets: list[bytes], row_bytes: int = 2048,
                   max_elements: int = wire.DEFAULT_MAX_ELEMENTS) -> list[str]:
    rows = np.zeros((len(packets), row_bytes), np.uint8)
    for i, p in enumerate(packets):
        rows[i, :min(len(p), row_bytes)] = np.frombuffer(p[:row_bytes], np.uint8)
    codes = wire.check_batch(wire.headers(rows), [len(p) for p in packets], max_elements)
    return [wire.REASONS[c] for c in codes]


def test_check_batch_names_each_bad_field_as_parse_does() -> None:
    packets = [good(), good()[:31], with_header(good(), magic=0x41414141),
               with_header(good(), version=2), with_header(good(), flags=0x10),
               with_header(good(), reserved=1), with_header(good(), kind=1),
               with_header(good(), start=4, end=4), with_header(good(start=96), total=99),
               with_header(good(), total=1 << 30), good()[:-2], good()[:-4],
               good() + b"\0\0\0\0", b"", with_header(good(), flags=wire.F_RETX)]
    assert batch_verdicts(packets) == [verdict(p) for p in packets]
    assert batch_verdicts(packets)[:2] == ["ok", "truncated"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(header_fields, st.integers(0, 1500)) | st.binary(max_size=64),
                min_size=1, max_size=40))
def test_check_batch_agrees_with_parse_on_fuzzed_batches(
        items: list[tuple[dict[str, int], int] | bytes]) -> None:
    """Mixed batches of fuzzed headers and random bytes; rows shorter than some packets
    (the receiver's buffer cuts them but knows their real length)."""
    packets = [i if isinstance(i, bytes) else bytes(wire.header_type()(**i[0])) + bytes(i[1])
               for i in items]
    assert batch_verdicts(packets, 1024, 10_000) == [verdict(p, 10_000) for p in packets]


def test_headers_are_a_view_of_the_rows_in_the_ctypes_layout() -> None:
    dt = wire.header_dtype()
    assert dt.itemsize == wire.HEADER_BYTES
    assert {n: dt.fields[n][1] for n in dt.names} == \
        {n: getattr(wire.header_type(), n).offset for n in wire.field_names()}
    rows = np.zeros((2, 64), np.uint8)
    packet = good(start=8, n=4, total=12)
    rows[1, :len(packet)] = np.frombuffer(packet, np.uint8)
    h = wire.headers(rows)
    assert (h["start"][1], h["end"][1], h["total"][1], h["job"][1]) == (8, 12, 12, JOB)
    with pytest.raises(ValueError, match="2-D uint8"):
        wire.headers(np.zeros((2, 16), np.uint8))
