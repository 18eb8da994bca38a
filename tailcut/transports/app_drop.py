"""App-drop transport: the sender drops 1-p of each vector's coordinates at random and
sends the rest over TCP: the paper's application-level baseline.

A PUSH or PARAMS frame is a TCP-transport frame (tcp.py) whose values are only the
kept coordinates, followed by a trailer naming them::

    4 bytes          total elements of the full vector, big-endian
    ceil(total/8)    which coordinates were kept, np.packbits(bitorder="little")

The receiver checks that the trailer keeps exactly as many coordinates as the frame
carries and hands the application the full-length vector with that mask. HELLO and
STOP frames are plain TCP frames.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from tailcut.spec import fraction
from tailcut.transports import base, tcp, wire
from tailcut.transports.base import Message

TOTAL = struct.Struct("!I")


class AppDropConnection(tcp.TcpConnection):
    """A TCP connection that sends only a random fraction p of every vector."""

    def __init__(self, inner: tcp.TcpConnection, p: float, rng: np.random.Generator) -> None:
        sock = inner._sock
        assert sock is not None
        super().__init__(sock, inner.peer, inner.max_elements)
        inner._sock = None  # this object owns the socket now
        # app-drop sends each vector as one frame of its kept coordinates: it cannot cut
        # it per tensor (CadentFlow), and a tagged TcpConnection would also write from a
        # sender thread beside this class's own writes. Refuse tagging by name.
        self.cuts = _Untagged(self.peer)
        self.p = p
        self._rng = rng

    def send(self, msg: Message, timeout_s: float | None = None) -> None:
        if int(msg.kind) not in wire.DATA_KINDS:
            super().send(msg, timeout_s)
            return
        values = np.ascontiguousarray(msg.values, dtype="<f4").reshape(-1)
        total = values.size
        keep = math.ceil(self.p * total)
        mask = np.zeros(total, bool)
        mask[self._rng.choice(total, size=keep, replace=False)] = True
        kept = Message(msg.kind, msg.iteration, msg.sender, values[mask],
                       sent_at_ns=msg.sent_at_ns)
        trailer = TOTAL.pack(total) + np.packbits(mask, bitorder="little").tobytes()
        frame = tcp.encode(kept, self.max_elements) + trailer
        sock = self._live()
        sock.settimeout(None if timeout_s is None else max(timeout_s, 1e-6))
        try:
            sock.sendall(frame)
        except TimeoutError:
            self.close()
            raise base.TransportTimeout(f"sending to {self.peer} took more than {timeout_s} s") \
                from None
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError) as err:
            self.close()
            raise base.PeerClosed(f"{self.peer} closed the connection while we sent to it") \
                from err

    def recv(self, timeout_s: float | None = None) -> Message:
        deadline = base.deadline_after(timeout_s)
        msg = super().recv(timeout_s)
        if int(msg.kind) not in wire.DATA_KINDS:
            return msg
        (total,) = TOTAL.unpack(self._read(TOTAL.size, deadline, what="app-drop total"))
        if total > self.max_elements or total < msg.values.size:
            self.close()
            raise base.ProtocolError(f"{self.peer}: app-drop total {total} with "
                                     f"{msg.values.size} kept values (max_elements="
                                     f"{self.max_elements})")
        packed = self._read((total + 7) // 8, deadline, what="app-drop mask")
        mask = np.unpackbits(np.frombuffer(packed, np.uint8), count=total,
                             bitorder="little").astype(bool)
        if int(mask.sum()) != msg.values.size:
            self.close()
            raise base.ProtocolError(f"{self.peer}: app-drop mask keeps {int(mask.sum())} "
                                     f"coordinates, the frame carries {msg.values.size}")
        values = np.zeros(total, dtype="<f4")
        values[mask] = msg.values
        msg.values = values
        msg.mask = None if mask.all() else mask
        msg.wire_bytes += TOTAL.size + len(packed)
        return msg


class _Untagged(dict):  # type: ignore[type-arg]
    """An always-empty ``cuts``: tagging an app-drop connection raises TransportError."""

    def __init__(self, peer: str) -> None:
        super().__init__()
        self.peer = peer

    def __setitem__(self, key: object, value: object) -> None:
        raise base.TransportError(f"the app-drop connection to {self.peer} cannot send "
                                  "tagged per-tensor messages (CadentFlow); use transport "
                                  "tcp, udp or bounded-loss")


class AppDropTransport(tcp.TcpTransport):
    """TCP carrying a random fraction p of every vector."""

    name = "app-drop"

    def __init__(self, p: float = 0.9, max_elements: int = tcp.DEFAULT_MAX_ELEMENTS,
                 seed: int | None = None, congestion_control: str | None = None) -> None:
        super().__init__(max_elements, congestion_control)
        self.p = fraction.check(p, what="0.9 = send 90% of every vector")
        self._rng = np.random.default_rng(seed)

    def listen(self, host: str, port: int, count: int, timeout_s: float) -> list[base.Connection]:
        return [self._wrap(c) for c in super().listen(host, port, count, timeout_s)]

    def connect(self, host: str, port: int, timeout_s: float) -> base.Connection:
        return self._wrap(super().connect(host, port, timeout_s))

    def _wrap(self, conn: base.Connection) -> base.Connection:
        assert isinstance(conn, tcp.TcpConnection)
        return AppDropConnection(conn, self.p, self._rng)
