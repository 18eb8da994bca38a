"""The bounded-loss wire format: build and strictly parse range-indexed float32 packets.

One UDP datagram is a 32-byte header then ``end - start`` little-endian float32
values, elements ``[start, end)`` of a message's vector. The header's layout is read
from ``struct tailcut_bl_hdr`` in ebpf/partial.h, the same declaration the XDP counter
compiles, and turned into a ctypes big-endian structure here, so C and Python cannot
disagree on an offset. docs/bounded-loss.md shows it field by field.

``parse`` trusts nothing: every field is checked and a bad packet raises
``BadPacket`` naming the field and what is wrong, before any payload byte is read.
``check_batch`` makes the same checks, in the same order, on many headers at once (the
receiver's path); a test holds the two to the same verdict on fuzzed packets.
"""

from __future__ import annotations

import ctypes
import hashlib
import struct
from collections.abc import Iterator
from functools import cache
from typing import NamedTuple

import numpy as np

from tailcut import ebpfheaders
from tailcut.transports import base

HEADER_FILE = ebpfheaders.EBPF_DIR / "partial.h"
STRUCT = "tailcut_bl_hdr"
VALUE_DTYPE = np.dtype("<f4")
# IP (20) and UDP (8) headers: a 1500-byte MTU leaves 1472 bytes for our datagram.
IP_UDP_BYTES = 28
DEFAULT_MTU = 1500
# Largest total a receiver accepts before allocating; 2**26 floats is 256 MiB.
DEFAULT_MAX_ELEMENTS = 1 << 26

class BadPacket(base.ProtocolError):
    """A datagram that is not a well-formed bounded-loss packet; says which field."""


@cache
def _layout() -> tuple[type[ctypes.BigEndianStructure], dict[str, int]]:
    """The ctypes view of struct tailcut_bl_hdr and the TAILCUT_BL_* constants."""
    header = ebpfheaders.struct_type(HEADER_FILE, STRUCT)
    consts = ebpfheaders.defines(HEADER_FILE, "TAILCUT_BL_")
    if ctypes.sizeof(header) != consts["TAILCUT_BL_HDR_BYTES"]:
        raise RuntimeError(f"{HEADER_FILE}: struct {STRUCT} is {ctypes.sizeof(header)} bytes, "
                           f"TAILCUT_BL_HDR_BYTES says {consts['TAILCUT_BL_HDR_BYTES']}")
    return header, consts


def header_type() -> type[ctypes.BigEndianStructure]:
    return _layout()[0]


def const(name: str) -> int:
    """A TAILCUT_BL_* constant of ebpf/partial.h, e.g. const("MAGIC")."""
    return _layout()[1][f"TAILCUT_BL_{name}"]


def header_bytes() -> int:
    return ctypes.sizeof(header_type())


def field_names() -> list[str]:
    return [field[0] for field in header_type()._fields_]


def _struct() -> struct.Struct:
    """A struct.Struct with the ctypes view's layout (parsing is ~5x faster with it)."""
    codes = {1: "B", 2: "H", 4: "I", 8: "Q"}
    fmt = ">" + "".join(codes[ctypes.sizeof(field[1])] for field in header_type()._fields_)
    unpacker = struct.Struct(fmt)
    if unpacker.size != ctypes.sizeof(header_type()):  # the view has padding: never here
        raise RuntimeError(f"struct {STRUCT} has padding; wire.py assumes none")
    return unpacker


MAGIC = const("MAGIC")
VERSION = const("VERSION")
F_RETX = const("F_RETX")
F_LAST = const("F_LAST")
FLAGS = const("FLAGS")
HEADER_BYTES = header_bytes()
DATA_KINDS = frozenset({int(base.Kind.PUSH), int(base.Kind.PARAMS)})
_UNPACK = _struct()


def elements_per_packet(mtu: int = DEFAULT_MTU) -> int:
    """Whole float32s that fit one datagram under ``mtu``: 360 for 1500."""
    n = (mtu - IP_UDP_BYTES - HEADER_BYTES) // VALUE_DTYPE.itemsize
    if n < 1:
        raise ValueError(f"mtu={mtu}: too small for a {HEADER_BYTES}-byte header and one float")
    return n


def job_id(job: str) -> int:
    """The 32-bit id of job name ``job`` on the wire: the first 4 bytes of its sha256."""
    return int.from_bytes(hashlib.sha256(job.encode()).digest()[:4], "big")


class _Fields(NamedTuple):
    """The header's fields in order (checked against the ctypes view by a test)."""

    magic: int
    version: int
    flags: int
    kind: int
    reserved: int
    job: int
    message: int
    seq: int
    start: int
    end: int
    total: int


class Packet(NamedTuple):
    """One parsed datagram. ``values`` is a read-only view into the datagram. (A named
    tuple, not a dataclass: the receiver builds one per packet, ~90k a second.)"""

    flags: int
    kind: int
    job: int
    message: int
    seq: int
    start: int
    end: int
    total: int
    values: np.ndarray

    @property
    def elements(self) -> int:
        return self.end - self.start


def build(*, job: int, message: int, seq: int, start: int, total: int,
          values: np.ndarray, kind: int = int(base.Kind.PUSH), flags: int = 0) -> bytes:
    """One datagram carrying ``values`` as elements [start, start + len(values))."""
    hdr = header_type()(magic=MAGIC, version=VERSION, flags=flags, kind=kind, reserved=0,
                        job=job, message=message, seq=seq, start=start,
                        end=start + len(values), total=total)
    return bytes(hdr) + np.ascontiguousarray(values, dtype=VALUE_DTYPE).tobytes()


def slot_range(slot: int, stride: int, total: int) -> tuple[int, int]:
    """Elements [start, end) of packet slot ``slot`` of a ``total``-element message."""
    start = slot * stride
    return start, min(start + stride, total)


def slots(total: int, stride: int) -> int:
    """Packets a ``total``-element message needs at ``stride`` elements each."""
    return -(-total // stride)


def packets(values: np.ndarray, *, job: int, message: int, stride: int,
            kind: int = int(base.Kind.PUSH)) -> Iterator[bytes]:
    """Every datagram of ``values`` in slot order, seq = slot (a first pass in order)."""
    total = len(values)
    for slot in range(slots(total, stride)):
        start, end = slot_range(slot, stride, total)
        yield build(job=job, message=message, seq=slot, start=start, total=total,
                    values=values[start:end], kind=kind)


def parse(data: bytes | bytearray | memoryview,
          max_elements: int = DEFAULT_MAX_ELEMENTS) -> Packet:
    """Check every field of datagram ``data`` and return it; raise BadPacket if any is wrong."""
    view = memoryview(data).cast("B")
    if len(view) < HEADER_BYTES:
        raise BadPacket(f"truncated: {len(view)} bytes, the header alone is {HEADER_BYTES}")
    h = _Fields(*_UNPACK.unpack_from(view))
    if h.magic != MAGIC:
        raise BadPacket(f"magic: {h.magic:#010x}, expected {MAGIC:#010x} (\"TCLB\")")
    if h.version != VERSION:
        raise BadPacket(f"version: {h.version}, this receiver speaks {VERSION}")
    if h.flags & ~FLAGS:
        raise BadPacket(f"flags: {h.flags:#04x} has unknown bits (known: {FLAGS:#04x})")
    if h.reserved != 0:
        raise BadPacket(f"reserved: {h.reserved}, must be 0")
    if h.kind not in DATA_KINDS:
        raise BadPacket(f"kind: {h.kind}, a data packet is PUSH (2) or PARAMS (3)")
    if h.total > max_elements:
        raise BadPacket(f"total: {h.total} elements exceeds max_elements={max_elements}")
    if h.end <= h.start:
        raise BadPacket(f"range: end {h.end} <= start {h.start}")
    if h.end > h.total:
        raise BadPacket(f"range: end {h.end} > total {h.total}")
    payload = len(view) - HEADER_BYTES
    want = (h.end - h.start) * VALUE_DTYPE.itemsize
    if payload % VALUE_DTYPE.itemsize:
        raise BadPacket(f"payload: {payload} bytes is not a whole number of float32s")
    if payload != want:
        raise BadPacket(f"payload: {payload} bytes, range [{h.start}, {h.end}) needs {want}")
    values = np.frombuffer(view[HEADER_BYTES:], dtype=VALUE_DTYPE)
    return Packet(h.flags, h.kind, h.job, h.message, h.seq, h.start, h.end, h.total, values)


# What check_batch reports per datagram: 0 = well-formed, else 1 + the index of the
# first failed check here, named as parse's BadPacket message starts.
REASONS = ("ok", "truncated", "magic", "version", "flags", "reserved", "kind", "total",
           "range", "range", "payload", "payload")


@cache
def header_dtype() -> np.dtype:
    """The header as a numpy structured dtype, from the ctypes view of ebpf/partial.h."""
    hdr = header_type()
    sizes = {1: "u1", 2: ">u2", 4: ">u4", 8: ">u8"}
    names, formats, offsets = [], [], []
    for field in hdr._fields_:
        name, ctype = field[0], field[1]
        names.append(name)
        formats.append(sizes[ctypes.sizeof(ctype)])
        offsets.append(getattr(hdr, name).offset)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                     "itemsize": HEADER_BYTES})


def headers(data: np.ndarray) -> np.ndarray:
    """The headers of datagrams ``data[i, :]`` (a 2-D uint8 array, one row each) as a
    structured view, no copy. Rows shorter than a header read as whatever is there;
    ``check_batch`` refuses them by length first."""
    if data.ndim != 2 or data.dtype != np.uint8 or data.shape[1] < HEADER_BYTES \
            or data.strides[1] != 1:
        raise ValueError("datagram rows must be a 2-D uint8 array, rows >= the header")
    return np.ndarray((data.shape[0],), header_dtype(), data, 0, (data.strides[0],))


def words(data: np.ndarray) -> np.ndarray:
    """The headers of datagram rows ``data`` as 32-bit words in memory order (a view),
    to compare with ``template`` under ``shared_bits``."""
    headers(data)  # the same checks of the rows
    return np.ndarray((data.shape[0], HEADER_BYTES // 4), np.uint32, data, 0,
                      (data.strides[0], 4))


@cache
def shared_bits() -> np.ndarray:
    """Per header word, the bits every packet of one message has in common: all but
    seq, start, end and the known flags (an unknown flag bit must still be 0)."""
    dt = header_dtype()
    m = np.zeros(1, dt)
    for name in field_names():
        m[name] = np.iinfo(dt[name]).max
    m["seq"] = m["start"] = m["end"] = 0
    m["flags"] = 0xFF & ~FLAGS
    return m.view(np.uint32)


def template(job: int, message: int, kind: int, total: int) -> np.ndarray:
    """The header words a well-formed packet of this message has under ``shared_bits``."""
    t = np.zeros(1, header_dtype())
    t["magic"], t["version"], t["kind"] = MAGIC, VERSION, kind
    t["job"], t["message"], t["total"] = job, message, total
    return t.view(np.uint32)


def check_batch(hdr: np.ndarray, lengths: np.ndarray,
                max_elements: int = DEFAULT_MAX_ELEMENTS) -> np.ndarray:
    """``parse``'s checks on many datagrams at once: the index into REASONS of the
    first check each one fails (0: none). ``hdr`` from ``headers``, ``lengths`` the
    datagrams' real lengths in bytes."""
    lengths = np.asarray(lengths, np.int64)
    start = hdr["start"].astype(np.int64)
    end = hdr["end"].astype(np.int64)
    total = hdr["total"].astype(np.int64)
    kind = hdr["kind"]
    payload = lengths - HEADER_BYTES
    itemsize = VALUE_DTYPE.itemsize
    not_data = np.ones(len(kind), bool)
    for k in DATA_KINDS:
        not_data &= kind != k
    checks = [
        lengths < HEADER_BYTES,
        hdr["magic"] != MAGIC,
        hdr["version"] != VERSION,
        (hdr["flags"] & (0xFF & ~FLAGS)) != 0,
        hdr["reserved"] != 0,
        not_data,
        total > max_elements,
        end <= start,
        end > total,
        payload % itemsize != 0,
        payload != (end - start) * itemsize,
    ]
    failed = checks[0].copy()
    for c in checks[1:]:
        failed |= c
    codes = np.zeros(len(lengths), np.uint8)
    if failed.any():
        # The first check a datagram fails names it, as parse raises at the first one.
        for code in range(len(checks), 0, -1):
            codes[checks[code - 1]] = code
    return codes


def describe_flags(flags: int) -> str:
    names = [name for bit, name in ((F_RETX, "RETX"), (F_LAST, "LAST")) if flags & bit]
    return "|".join(names) or "-"
