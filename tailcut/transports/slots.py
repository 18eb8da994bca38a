"""A vector as one datagram per slot, for the ToR protocols (aggregation's ADDs, the
multicast's PARAMS): sent with sendmmsg and read with recvmmsg, a whole batch checked
at once with numpy.

A model is a thousand slots or more an iteration, and a Python loop paid ~10-15 us per
datagram to pack or parse it (14 ms of CPU per worker and iteration for the ADDs of
the in-network bench's model, times eight workers on two cores). Here each datagram is
gathered from its header row and its slot of the values in place (batch.Batch), and
the receiver parses a batch of rows in one go.

Both protocols share the header's layout (ebpf/agg.h, ebpf/mcast.h): magic, version,
op, status, worker, job, iteration, slot, count and two more words, big-endian.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

import numpy as np

from tailcut.transports import base, batch

HEADER = np.dtype([("magic", ">u4"), ("version", "u1"), ("op", "u1"), ("status", "u1"),
                   ("worker", "u1"), ("job", ">u4"), ("iteration", ">u4"), ("slot", ">u4"),
                   ("count", ">u4"), ("word9", ">u4"), ("word10", ">u4")])


_PACKER = struct.Struct(">IBBBBIIIIII")   # HEADER, one datagram at a time
H = TypeVar("H")


def packet(magic: int, version: int, op: int, *, job: int, iteration: int, slot: int,
           payload: bytes, count: int | None = None, worker: int = 0) -> bytes:
    """A datagram: header, then ``payload`` (``count`` values; by default its 4-byte
    words)."""
    count = len(payload) // 4 if count is None else count
    return _PACKER.pack(magic, version, op, 0, worker, job, iteration, slot, count,
                        0, 0) + payload


def parse(data: bytes, magic: int, version: int, what: str,
          header: Callable[..., H]) -> tuple[H, bytes]:
    """A datagram's header, as ``header(op, status, worker, job, iteration, slot,
    count, word9, word10)`` (each protocol names its last two words), and its payload;
    a ProtocolError naming ``what`` and its fault."""
    size = _PACKER.size
    if len(data) < size:
        raise base.ProtocolError(f"{what}: {len(data)} bytes, header is {size}")
    got_magic, got_version, *fields = _PACKER.unpack_from(data)
    if got_magic != magic or got_version != version:
        raise base.ProtocolError(f"{what}: magic {got_magic:#x} version {got_version}")
    count = fields[6]
    if len(data) != size + 4 * count:
        raise base.ProtocolError(f"{what}: {len(data)} bytes for count {count}")
    return header(*fields), data[size:]


def check_layout(packer: struct.Struct) -> None:
    """Refuse a protocol whose header (from its C header) is not HEADER's layout."""
    if packer.size != HEADER.itemsize or packer.format != _PACKER.format:
        raise RuntimeError(f"ToR header {packer.format!r} ({packer.size} bytes) is not the "
                           f"layout tailcut.transports.slots sends")


def slot_bounds(elements: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of each slot of ``elements`` values, ``stride`` per slot."""
    starts = np.arange(0, elements, stride, dtype=np.int64)
    return starts, np.minimum(stride, elements - starts)


class Outgoing:
    """Every slot's datagram of one vector of ``elements`` values of ``dtype``, to each
    of ``addresses``: the headers are filled once, ``put`` writes an iteration's values
    and number in place, ``send`` sends them all to every address."""

    def __init__(self, sock: socket.socket, addresses: Sequence[tuple[str, int]], *,
                 magic: int, version: int, op: int, job: int, worker: int,
                 elements: int, stride: int, dtype: str) -> None:
        starts, lengths = slot_bounds(elements, stride)
        self.headers = np.zeros(len(starts), HEADER)
        h = self.headers
        h["magic"], h["version"], h["op"], h["job"], h["worker"] = \
            magic, version, op, job, worker
        h["slot"], h["count"] = np.arange(len(starts)), lengths
        self.values = np.zeros(elements, dtype)
        self.starts, self.lengths = starts, lengths
        size = self.values.itemsize
        pieces = [batch.Piece(self.headers, np.arange(len(h)) * HEADER.itemsize,
                              np.full(len(h), HEADER.itemsize)),
                  batch.Piece(self.values, starts * size, lengths * size)]
        self._batches = [batch.Batch(sock, pieces, address) for address in addresses]

    def __len__(self) -> int:
        return len(self.headers)

    def put(self, iteration: int, values: np.ndarray,
            casting: Literal["same_kind", "unsafe"] = "same_kind") -> None:
        """Write an iteration's number and values (``casting``: numpy's, for them)."""
        self.headers["iteration"] = iteration
        np.copyto(self.values, values, casting=casting)

    def send(self) -> None:
        for b in self._batches:
            b.send(0, len(self.headers))

    def datagram(self, slot: int, worker: int | None = None) -> bytes:
        """Slot ``slot``'s datagram as bytes (a repair), with another ``worker`` field."""
        head = bytearray(self.headers[slot:slot + 1].tobytes())
        if worker is not None:
            head[7] = worker
        lo = int(self.starts[slot])
        return bytes(head) + self.values[lo:lo + int(self.lengths[slot])].tobytes()


class Incoming:
    """Batches of slot datagrams from a socket, up to ``batch_count`` per call, each
    row ``row_bytes`` long (a longer datagram is cut and then refused: its length
    says so)."""

    def __init__(self, sock: socket.socket, batch_count: int, row_bytes: int) -> None:
        self._inbox = batch.Inbox(sock, batch_count, row_bytes)
        self.row_bytes = row_bytes

    def recv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(headers, payload rows, lengths) of the datagrams waiting (none: empty);
        rows shorter than a header have a zeroed header (refused by any magic)."""
        n = self._inbox.recv()
        rows = self._inbox.data[:n]
        lengths = self._inbox.lengths(n)
        short = lengths < HEADER.itemsize
        if short.any():
            rows[short, :HEADER.itemsize] = 0
        headers = rows[:, :HEADER.itemsize].copy().view(HEADER).reshape(n)
        return headers, rows[:, HEADER.itemsize:], lengths
