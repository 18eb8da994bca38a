"""The control channel of the datagram transports (udp, bounded-loss): small TCP frames.

Data goes as range-indexed UDP packets (wire.py); everything about a message that is
not its values goes over one TCP connection per peer, so it is never lost:

    SETUP  both ways at connect: the connector's UDP port (count) and the connection
           id it wants on the listener's message ids (message; 0: the listener's own),
           then the connection id the listener gives it, for its message ids (message)
    MSG    a whole message that carries no vector (HELLO, STOP): kind, iteration, sender
    BEGIN  sender -> receiver before the packets: message id, kind, iteration, sender,
           total elements (count), sent_at_ns, and the rate the sender starts at (its
           last grant, whole Mbit/s; 0: none, its link's), so that a receiver whose
           share for it is the same sends no GRANT; for a CadentFlow-tagged message
           the extra bytes are its cut table (cutlayout.py)
    END    sender -> receiver after a pass over the message: packets in the pass (count).
           A CadentFlow-tagged pass sends one END per priority class it used, each in
           that class, behind that class's packets; ``iteration`` then says how many
           (0 or 1: one), and the pass is over when all of them are in
    NACK   receiver -> sender: below p after a pass; the missing slots follow as u32s
    DONE   receiver -> sender: p reached (or everything arrived); stop sending
    GRANT  receiver -> sender: pace this message (message id) at most at count kbit/s,
           its share of the receiver's link (congestion.py); sent at BEGIN and
           whenever the number of messages converging on the receiver changes

A frame is the 36-byte header below (big-endian) and ``extra`` bytes::

    offset size field
    0      4    magic b"TCBC"
    4      1    type (FrameType)
    5      1    kind (tailcut.transports.base.Kind) or 0
    6      2    BEGIN: the sender's start rate, Mbit/s; else 0
    8      4    message id
    12     4    iteration (signed)
    16     4    sender (signed; the PS is -1)
    20     4    count (meaning per type, above)
    24     8    sent_at_ns
    32     4    extra: bytes that follow
"""

from __future__ import annotations

import enum
import fcntl
import socket
import struct
import threading
import time
from dataclasses import dataclass

from tailcut.transports import base

MAGIC = b"TCBC"
HEADER = struct.Struct("!4sBBHIiiIQI")
# A NACK lists at most every slot of the largest message (8192 u32s = 32 KiB).
MAX_EXTRA = 1 << 16
# TCP_RTO_MIN_US (Linux 6.16+; Python does not name it). A lost control frame is a lone
# small segment: no duplicate ACKs, so only a timer recovers it, and by default that
# is the 200 ms minimum RTO (or a tail loss probe padded by the 200 ms delayed-ACK
# allowance). Every message waits on its BEGIN and DONE, so the channel asks for a
# 5 ms floor (the kernel rounds it up to whole jiffies).
TCP_RTO_MIN_US = 45
CONTROL_RTO_MIN_US = 5000
SIOCOUTQNSD = 0x894B  # linux/sockios.h: bytes in the send queue not yet sent as segments
RETAG_WAIT_S = 0.05  # longest a frame waits for the previous ones to leave before re-tagging


class FrameType(enum.IntEnum):
    """Values are on the wire: never renumber."""

    SETUP = 1
    MSG = 2
    BEGIN = 3
    END = 4
    NACK = 5
    DONE = 6
    GRANT = 7


@dataclass(frozen=True)
class Frame:
    type: FrameType
    kind: int = 0
    message: int = 0
    iteration: int = 0
    sender: int = 0
    count: int = 0
    sent_at_ns: int = 0
    extra: bytes = b""
    rate_mbit: int = 0   # BEGIN only

    def encode(self) -> bytes:
        return HEADER.pack(MAGIC, int(self.type), self.kind, self.rate_mbit, self.message,
                           self.iteration,
                           self.sender, self.count, self.sent_at_ns, len(self.extra)) + self.extra


class Channel:
    """Frames over one TCP socket: ``send`` from any thread, ``read`` from one."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        # CadentFlow: the IP_TOS of frames sent without one of their own, and the one
        # the socket has now.
        self.default_tos = 0
        self._tos = 0
        self._send_lock = threading.Lock()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, TCP_RTO_MIN_US, CONTROL_RTO_MIN_US)
            self.rto_min_us: int | None = sock.getsockopt(socket.IPPROTO_TCP, TCP_RTO_MIN_US)
        except OSError:  # an older kernel: lost control frames cost up to 200 ms
            self.rto_min_us = None

    def send(self, frame: Frame, tos: int | None = None) -> None:
        """Send ``frame`` with IP_TOS ``tos`` (None: ``default_tos``)."""
        data = frame.encode()
        with self._send_lock:
            try:
                want = self.default_tos if tos is None else tos
                if want != self._tos:
                    self._retag(want)
                self.sock.sendall(data)
            except OSError as err:
                raise base.PeerClosed(f"{self.peer}: control channel closed: {err}") from err

    def _retag(self, tos: int) -> None:
        """Set IP_TOS once the frames written so far have left as segments: the kernel
        stamps a segment with the socket's TOS when it builds it (see tcp._set_tos).
        Frames are small and TCP_NODELAY, so this normally returns at once."""
        deadline = time.monotonic() + RETAG_WAIT_S
        while time.monotonic() < deadline:
            raw = fcntl.ioctl(self.sock.fileno(), SIOCOUTQNSD, b"\0\0\0\0")
            if struct.unpack("i", raw)[0] == 0:
                break
            time.sleep(0.0002)
        self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
        self._tos = tos

    def read(self) -> Frame:
        """The next frame; PeerClosed at a clean end, ProtocolError on bad bytes."""
        raw = self._exactly(HEADER.size, first=True)
        magic, ftype, kind, rate_mbit, message, iteration, sender, count, sent_at, extra = \
            HEADER.unpack(raw)
        if magic != MAGIC:
            raise base.ProtocolError(f"{self.peer}: control frame magic {magic!r}, "
                                     f"expected {MAGIC!r}")
        try:
            ftype = FrameType(ftype)
        except ValueError:
            raise base.ProtocolError(f"{self.peer}: unknown control frame type {ftype}") from None
        if rate_mbit and ftype != FrameType.BEGIN:
            raise base.ProtocolError(f"{self.peer}: control frame reserved field {rate_mbit}")
        if extra > MAX_EXTRA:
            raise base.ProtocolError(f"{self.peer}: control frame extra {extra} bytes > "
                                     f"{MAX_EXTRA}")
        body = self._exactly(extra, first=False) if extra else b""
        return Frame(ftype, kind, message, iteration, sender, count, sent_at, body, rate_mbit)

    def _exactly(self, n: int, first: bool) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except TimeoutError:
                raise  # (an OSError too) the caller's deadline, not a closed peer
            except OSError as err:
                raise base.PeerClosed(f"{self.peer}: control channel: {err}") from err
            if not chunk:
                if first and not buf:
                    raise base.PeerClosed(f"{self.peer} closed the connection")
                raise base.ProtocolError(f"{self.peer}: control frame cut short")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already disconnected
        self.sock.close()
