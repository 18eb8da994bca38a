"""TCP transport: every coordinate is delivered, in order; the baseline the others beat.

Each message is one frame: a fixed 28-byte header, then the values as raw
little-endian float32, then (only if flag bit 0 is set) the mask as packed bits::

    offset size field       notes
    0      4    magic       b"TCUT"
    4      2    version     1
    6      1    kind        tailcut.transports.base.Kind
    7      1    flags       bit 0: a mask follows the values; other bits must be 0
    8      4    iteration   signed
    12     4    sender      signed; the PS is -1, workers 0..N-1
    16     4    count       number of float32 values, at most max_elements
    20     8    sent_at_ns  sender's time.time_ns() when it started sending
    28     4*count          values
    ...    ceil(count/8)    mask, np.packbits(bitorder="little"), if flag bit 0

A message sent in parts (CadentFlow: one frame per tensor, each with its own IP_TOS,
see ``TcpConnection.cuts``) is several frames of the same kind, iteration and sender
with flag bit 1 set; each carries, between the header and its values, a part header::

    28     4    offset      where this part's values start in the whole message
    32     4    total       values in the whole message
    36     1    level       the part's priority level (255: untagged)
    37     3    padding     zero

``count`` is then the part's size; the receiver reassembles the parts (in any order)
into one Message whose ``parts`` list each part's range, level and times.

Header integers are big-endian (network order), so a packet dump reads
naturally; a 64714-float MLP gradient is 28 + 258856 bytes.
"""

from __future__ import annotations

import errno
import fcntl
import queue
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from tailcut.transports import base
from tailcut.transports.base import Kind, Message

MAGIC = b"TCUT"
VERSION = 1
HEADER = struct.Struct("!4sHBBiiIq")
FLAG_MASK = 0x01
FLAG_PART = 0x02
PART = struct.Struct("!IIB3x")
UNTAGGED = 255
# Refuse frames that claim more than this many values, before allocating: 2**26
# floats is 256 MiB, far above any model here (the MLP has ~65k).
DEFAULT_MAX_ELEMENTS = 1 << 26
_VALUE_DTYPE = np.dtype("<f4")
SIOCOUTQNSD = 0x894B  # linux/sockios.h: bytes in the send queue not yet sent
SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)  # asm-generic/socket.h
_NO_PACING_CAP = 0xFFFFFFFF  # ~0U: the kernel's "no cap"
_DRAIN_POLL_S = 0.0002
# A tagged connection's sender thread gives up on one message after this long, and
# close() waits at most this long for the queued messages to go out.
ASYNC_SEND_TIMEOUT_S = 30.0
_KINDS = frozenset(int(k) for k in Kind)


def encode(msg: Message, max_elements: int = DEFAULT_MAX_ELEMENTS) -> bytes:
    """The frame for ``msg`` (``sent_at_ns`` 0 is stamped with now)."""
    values = np.ascontiguousarray(msg.values, dtype=_VALUE_DTYPE).reshape(-1)
    if values.size > max_elements:
        raise ValueError(
            f"message has {values.size} values; the limit is max_elements={max_elements}"
        )
    flags = 0
    parts = [b"", values.tobytes()]
    if msg.mask is not None:
        if msg.mask.shape != (values.size,):
            raise ValueError(f"mask has shape {msg.mask.shape}; values have {values.size} elements")
        flags |= FLAG_MASK
        parts.append(np.packbits(msg.mask.astype(bool), bitorder="little").tobytes())
    sent_at_ns = msg.sent_at_ns or time.time_ns()
    parts[0] = HEADER.pack(
        MAGIC, VERSION, int(msg.kind), flags, msg.iteration, msg.sender, values.size, sent_at_ns
    )
    return b"".join(parts)


def encode_part(msg: Message, cut: base.Cut, sent_at_ns: int) -> list[bytes]:
    """The frame (header, part header, values) of one part of ``msg``."""
    values = np.ascontiguousarray(msg.values, dtype=_VALUE_DTYPE).reshape(-1)
    chunk = values[cut.offset : cut.offset + cut.size]
    header = HEADER.pack(MAGIC, VERSION, int(msg.kind), FLAG_PART, msg.iteration, msg.sender,
                         chunk.size, sent_at_ns)
    level = UNTAGGED if cut.level is None else cut.level
    return [header, PART.pack(cut.offset, values.size, level), chunk.tobytes()]


def set_max_pacing_rate(sock: socket.socket, bytes_per_s: float | None) -> None:
    """Cap ``sock``'s sending rate at ``bytes_per_s`` payload bytes per second with
    SO_MAX_PACING_RATE (TCP's internal pacing, no fq qdisc needed; whole bytes/s, at
    least 1, clamped to 32 bits); None lifts the cap. tailcut.scheduling.pacing says
    why coflow uses it."""
    if bytes_per_s is not None and not bytes_per_s > 0:
        raise ValueError(f"pacing rate {bytes_per_s} bytes/s: must be > 0 (None: no cap)")
    value = (_NO_PACING_CAP if bytes_per_s is None
             else min(_NO_PACING_CAP - 1, max(1, round(bytes_per_s))))
    # An unsigned 32-bit value: Python's int form is signed and cannot say ~0U.
    sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, struct.pack("I", value))


def _unsent_bytes(sock: socket.socket) -> int:
    """Bytes written to ``sock`` that TCP has not yet put into segments."""
    raw = fcntl.ioctl(sock.fileno(), SIOCOUTQNSD, b"\0\0\0\0")
    return int(struct.unpack("i", raw)[0])


def parse_header(
    header: bytes, peer: str, max_elements: int
) -> tuple[Kind, int, int, int, int, int]:
    """Check a header; return (kind, flags, iteration, sender, count, sent_at_ns)."""
    magic, version, kind, flags, iteration, sender, count, sent_at_ns = HEADER.unpack(header)
    if magic != MAGIC:
        raise base.ProtocolError(
            f"bad magic {magic!r} from {peer}: expected {MAGIC!r}; is something other "
            "than a tailcut TCP transport sending to this port?"
        )
    if version != VERSION:
        raise base.ProtocolError(
            f"protocol version {version} from {peer}: this side speaks version {VERSION}; "
            "run the same tailcut version on every pod"
        )
    if kind not in _KINDS:
        raise base.ProtocolError(
            f"unknown message kind {kind} from {peer}: known kinds are {sorted(_KINDS)}"
        )
    if flags & ~(FLAG_MASK | FLAG_PART) or flags == FLAG_MASK | FLAG_PART:
        raise base.ProtocolError(
            f"unknown flag bits {flags:#04x} from {peer}: {FLAG_MASK:#04x} (mask) and "
            f"{FLAG_PART:#04x} (part) are defined, not both at once"
        )
    if count > max_elements:
        raise base.ProtocolError(
            f"element count {count} from {peer} exceeds max_elements={max_elements}; "
            "refusing to allocate (raise max_elements in the transport options if the model "
            "is that big)"
        )
    return Kind(kind), flags, iteration, sender, count, sent_at_ns


def _socket_timeout(deadline: float | None) -> float | None:
    """A socket timeout for ``deadline``; never 0, which would mean non-blocking."""
    left = base.remaining(deadline)
    return None if left is None else max(left, 1e-6)


def _ready(sock: socket.socket, event: int, deadline: float | None) -> bool:
    """Wait until ``sock`` is readable/writable (``event``) or ``deadline`` passes.
    Raises PeerClosed when another thread closed the connection meanwhile."""
    left = base.remaining(deadline)
    fd = sock.fileno()
    if fd < 0:
        raise base.PeerClosed("the connection was closed while in use")
    poller = select.poll()
    poller.register(fd, event)
    ready = poller.poll(None if left is None else max(left, 0.0) * 1000)
    if any(revents & select.POLLNVAL for _, revents in ready):
        raise base.PeerClosed("the connection was closed while in use")
    return bool(ready)


class TcpConnection(base.Connection):
    """One TCP stream to a peer, carrying framed messages.

    A reader thread may receive while another thread sends on the same socket, so
    the socket stays in blocking mode for good: timeouts are waits in poll(2) and
    each call is made non-blocking with MSG_DONTWAIT. (Python's settimeout switches
    the whole file descriptor to O_NONBLOCK, which made a concurrent blocking send
    fail with EAGAIN.)"""

    def __init__(self, sock: socket.socket, peer: str, max_elements: int) -> None:
        self._sock: socket.socket | None = sock
        self.peer = peer
        self.max_elements = max_elements
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # CadentFlow: messages of these kinds (whose size matches) go out as one frame
        # per cut, in the cuts' order, each with IP_TOS tos_of(cut.level); other
        # messages carry control_tos. Left empty, nothing is tagged.
        self.cuts: dict[Kind, tuple[base.Cut, ...]] = {}
        self.control_tos: int = 0
        self.tos_of: Callable[[int], int] | None = None
        self._tos = 0
        # Layer-wise roles (tailcut.ml.layerwise): called with each part of a
        # message in parts as soon as it is in (a Message whose ``values`` is the whole
        # buffer being filled, valid in ``parts[0]``'s range), before the message is
        # complete. None: the receiver only returns whole messages.
        self.on_part: Callable[[Message], None] | None = None
        self._outbox: queue.Queue[list[tuple[int, list[bytes]]] | None] = queue.Queue()
        self._sender: threading.Thread | None = None
        self._send_error: base.TransportError | None = None
        # Set by close(): re-tagging stops waiting for the previous part to leave (a
        # peer that has stopped reading, e.g. a PS shard after STOP, would hold the
        # close for ASYNC_SEND_TIMEOUT_S; a few mis-tagged bytes at the end are harmless).
        self._closing = threading.Event()

    def _set_tos(self, sock: socket.socket, tos: int, deadline: float | None = None) -> None:
        """Set IP_TOS once every byte written so far has left the socket as segments.

        The kernel stamps a segment with the socket's TOS when it builds it, not when
        the bytes are written: switching at once would tag the previous part's unsent
        bytes with the next part's level (measured: most of a level-2 tensor went out
        at level 3). So wait until the send queue holds no unsent bytes first."""
        if tos == self._tos:
            return
        while _unsent_bytes(sock) > 0 and not self._closing.is_set():
            if deadline is not None and time.monotonic() > deadline:
                self.close()
                raise base.TransportTimeout(
                    f"sending to {self.peer}: the previous part did not leave in time")
            time.sleep(_DRAIN_POLL_S)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
        self._tos = tos

    def set_pacing_rate(self, bytes_per_s: float | None) -> None:
        """Cap this connection's sending rate (coflow: its flow's MADD rate); see
        set_max_pacing_rate."""
        set_max_pacing_rate(self._live(), bytes_per_s)

    def _frames(self, msg: Message, sock: socket.socket) -> list[tuple[int, list[bytes]]]:
        """(TOS, frame pieces) to send for ``msg``: one per cut, or one whole frame."""
        cuts = self.cuts.get(msg.kind)
        if cuts and msg.mask is None and msg.values.size == sum(c.size for c in cuts):
            sent_at_ns = msg.sent_at_ns or time.time_ns()
            msg.sent_at_ns = sent_at_ns
            tos = self.tos_of or (lambda level: 0)
            return [(0 if c.level is None else tos(c.level), encode_part(msg, c, sent_at_ns))
                    for c in cuts]
        return [(self.control_tos, [encode(msg, self.max_elements)])]

    def send(self, msg: Message, timeout_s: float | None = None) -> None:
        sock = self._live()
        frames = self._frames(msg, sock)
        if self.cuts:
            # Tagged: a sender thread writes, so that waiting for one part to leave
            # before re-tagging (_set_tos) does not hold up the caller's sends to its
            # other peers (a PS answering every worker would otherwise serve them one
            # after another). Errors surface on the next send or on close.
            self._enqueue(frames)
            return
        self._write(sock, frames, timeout_s)

    def send_cuts(self, msg: Message, cuts: Sequence[base.Cut],
                  timeout_s: float | None = None) -> None:
        """Send only ``cuts`` of ``msg`` as parts, each stamped now and tagged with its
        level (a layer-wise worker pushes each tensor as soon as its gradient is
        ready). The caller sends every cut of the message exactly once, and nothing
        else on this connection until the last one: the receiver reads the parts of a
        message back to back."""
        sock = self._live()
        sent_at_ns = time.time_ns()
        tos = self.tos_of or (lambda level: 0)
        frames = [(0 if c.level is None else tos(c.level), encode_part(msg, c, sent_at_ns))
                  for c in cuts]
        if self.cuts:
            self._enqueue(frames)
            return
        self._write(sock, frames, timeout_s)

    def _write(self, sock: socket.socket, frames: list[tuple[int, list[bytes]]],
               timeout_s: float | None) -> None:
        deadline = base.deadline_after(timeout_s)
        try:
            for tos, pieces in frames:
                self._set_tos(sock, tos, deadline)
                view = memoryview(b"".join(pieces)).cast("B")
                sent = 0
                while sent < len(view):
                    if not _ready(sock, select.POLLOUT, deadline):
                        # Part of the frame may be out: the stream is no longer usable.
                        self.close()
                        raise base.TransportTimeout(
                            f"sending to {self.peer} took more than {timeout_s} s")
                    try:
                        sent += sock.send(view[sent:], socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        continue  # the buffer filled again between poll and send
        except OSError as err:
            if not isinstance(err, (BrokenPipeError, ConnectionError)) and err.errno != errno.EBADF:
                raise
            self.close()
            raise base.PeerClosed(f"{self.peer} closed the connection while we sent to it") from err

    def _enqueue(self, frames: list[tuple[int, list[bytes]]]) -> None:
        if self._send_error is not None:
            raise self._send_error
        if self._sender is None:
            self._sender = threading.Thread(target=self._send_loop, daemon=True,
                                            name=f"tcp-send-{self.peer}")
            self._sender.start()
        self._outbox.put(frames)

    def _send_loop(self) -> None:
        while True:
            frames = self._outbox.get()
            if frames is None:
                return
            try:
                self._write(self._live(), frames, ASYNC_SEND_TIMEOUT_S)
            except base.TransportError as err:
                self._send_error = err
                return

    def recv(self, timeout_s: float | None = None) -> Message:
        deadline = base.deadline_after(timeout_s)
        header = self._read(HEADER.size, deadline, what="header", frame_started=False)
        kind, flags, iteration, sender, count, sent_at_ns = parse_header(
            bytes(header), self.peer, self.max_elements
        )
        if flags & FLAG_PART:
            return self._recv_parts(kind, iteration, sender, count, sent_at_ns, deadline)
        values = np.empty(count, dtype=_VALUE_DTYPE)
        self._read_into(values.data.cast("B"), deadline, what="values")
        mask = None
        mask_bytes = 0
        if flags & FLAG_MASK:
            mask_bytes = (count + 7) // 8
            packed = self._read(mask_bytes, deadline, what="mask")
            mask = np.unpackbits(
                np.frombuffer(packed, np.uint8), count=count, bitorder="little"
            ).astype(bool)
        return Message(
            kind=kind,
            iteration=iteration,
            sender=sender,
            values=values,
            mask=mask,
            sent_at_ns=sent_at_ns,
            received_at_ns=time.time_ns(),
            wire_bytes=HEADER.size + values.nbytes + mask_bytes,
        )

    def _recv_parts(self, kind: Kind, iteration: int, sender: int, count: int,
                    sent_at_ns: int, deadline: float | None) -> Message:
        """Read the parts of one message (the first one's header is read) and join them."""
        values: np.ndarray | None = None
        filled = 0
        parts: list[base.Part] = []
        wire = 0
        while True:
            offset, total, level = PART.unpack(bytes(self._read(PART.size, deadline, "part")))
            if values is None:
                if total > self.max_elements:
                    raise base.ProtocolError(
                        f"message of {total} values in parts from {self.peer} exceeds "
                        f"max_elements={self.max_elements}")
                values = np.empty(total, dtype=_VALUE_DTYPE)
            if values.size != total or offset + count > total:
                self.close()
                raise base.ProtocolError(
                    f"part [{offset}, {offset + count}) of a {total}-value message from "
                    f"{self.peer} does not fit the message of {values.size} values")
            self._read_into(values[offset:offset + count].data.cast("B"), deadline, "values")
            parts.append(base.Part(offset, count, None if level == UNTAGGED else level,
                                   sent_at_ns, time.time_ns()))
            filled += count
            wire += HEADER.size + PART.size + 4 * count
            if self.on_part is not None:
                self.on_part(Message(kind=kind, iteration=iteration, sender=sender,
                                     values=values, sent_at_ns=sent_at_ns,
                                     received_at_ns=parts[-1].received_at_ns,
                                     parts=[parts[-1]]))
            if filled >= values.size:
                break
            header = self._read(HEADER.size, deadline, what="header")
            k, flags, it, snd, count, sent_at_ns = parse_header(
                bytes(header), self.peer, self.max_elements)
            if (k, it, snd) != (kind, iteration, sender) or not flags & FLAG_PART:
                self.close()
                raise base.ProtocolError(
                    f"{self.peer} sent {k.name}({it}) from {snd} before the last part of "
                    f"{kind.name}({iteration}) from {sender}")
        if filled != values.size:
            self.close()
            raise base.ProtocolError(f"parts from {self.peer} hold {filled} values; the "
                                     f"message has {values.size}")
        return Message(kind=kind, iteration=iteration, sender=sender, values=values,
                       sent_at_ns=min(p.sent_at_ns for p in parts),
                       received_at_ns=parts[-1].received_at_ns, wire_bytes=wire, parts=parts)

    def close(self) -> None:
        self._closing.set()
        sender, self._sender = self._sender, None
        if sender is not None and sender is not threading.current_thread():
            self._outbox.put(None)  # what is queued (a STOP, say) still goes out
            sender.join(ASYNC_SEND_TIMEOUT_S)
        sock, self._sock = self._sock, None
        if sock is None:
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already disconnected: closing is all that is left to do
        sock.close()

    def _live(self) -> socket.socket:
        if self._sock is None:
            raise base.PeerClosed(f"connection to {self.peer} is closed")
        return self._sock

    def _read(
        self, n: int, deadline: float | None, what: str, frame_started: bool = True
    ) -> bytearray:
        buf = bytearray(n)
        self._read_into(memoryview(buf), deadline, what, frame_started)
        return buf

    def _read_into(
        self, view: memoryview, deadline: float | None, what: str, frame_started: bool = True
    ) -> None:
        """Fill ``view`` from the socket or raise; a frame cut short is a ProtocolError."""
        sock = self._live()
        got = 0
        while got < len(view):
            if not _ready(sock, select.POLLIN, deadline):
                if frame_started or got:
                    # We hold half a frame: the stream cannot be resynchronised.
                    self.close()
                raise base.TransportTimeout(
                    f"no complete message from {self.peer} in time (waiting for the {what})"
                )
            try:
                n = sock.recv_into(view[got:], 0, socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue  # woken without data (e.g. a spurious wake-up)
            except OSError as err:
                if err.errno == errno.EBADF:  # another thread closed it meanwhile
                    raise base.PeerClosed(f"connection to {self.peer} was closed") from err
                if not isinstance(err, (ConnectionResetError, ConnectionAbortedError)):
                    raise
                self.close()
                raise base.PeerClosed(f"{self.peer} reset the connection") from err
            if n == 0:
                self.close()
                if not frame_started and got == 0:
                    raise base.PeerClosed(f"{self.peer} closed the connection")
                raise base.ClosedMidFrame(
                    f"truncated frame from {self.peer}: expected {len(view)} bytes of {what}, "
                    f"the connection closed after {got}"
                )
            got += n


class TcpTransport(base.Transport):
    """Framed messages over TCP with TCP_NODELAY (no Nagle delay on small frames)."""

    name = "tcp"

    def __init__(self, max_elements: int = DEFAULT_MAX_ELEMENTS,
                 congestion_control: str | None = None) -> None:
        """``congestion_control``: the TCP congestion control of every connection
        (TCP_CONGESTION, e.g. "cubic"); None: the namespace's default."""
        super().__init__()
        if max_elements < 1:
            raise ValueError(f"max_elements={max_elements}: must be >= 1")
        self.max_elements = max_elements
        self.congestion_control = congestion_control

    def listen(self, host: str, port: int, count: int, timeout_s: float) -> list[base.Connection]:
        deadline = base.deadline_after(timeout_s)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # A PS restarted on the same port must not wait out TIME_WAIT.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        conns: list[base.Connection] = []
        try:
            use_congestion_control(listener, self.congestion_control)  # accepted ones inherit it
            try:
                listener.bind((host, port))
            except OSError as err:
                raise base.TransportError(
                    f"cannot listen on {host}:{port}: {err.strerror} (is another job or PS "
                    "using the port, or is the address not on this host?)"
                ) from err
            listener.listen(count)
            while len(conns) < count:
                listener.settimeout(_socket_timeout(deadline))
                try:
                    sock, addr = listener.accept()
                except TimeoutError:
                    raise base.TransportTimeout(
                        f"only {len(conns)} of {count} peers connected to {host}:{port} "
                        f"within {timeout_s} s"
                    ) from None
                sock.settimeout(None)
                conns.append(TcpConnection(sock, f"{addr[0]}:{addr[1]}", self.max_elements))
        except BaseException:
            for conn in conns:
                conn.close()
            raise
        finally:
            listener.close()
        return conns

    def connect(self, host: str, port: int, timeout_s: float) -> base.Connection:
        sock = base.connect_tcp(host, port, timeout_s)
        try:
            use_congestion_control(sock, self.congestion_control)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return TcpConnection(sock, f"{host}:{port}", self.max_elements)


def use_congestion_control(sock: socket.socket, name: str | None) -> None:
    """Give ``sock`` TCP congestion control ``name`` (None: leave the default); a
    TransportError naming the spec field and the fix if the kernel refuses."""
    if name is None:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())
    except OSError as err:
        available = _proc_sys("tcp_available_congestion_control")
        if err.errno == errno.EPERM:
            fix = (f"an unprivileged process may only pick one of "
                   f"net.ipv4.tcp_allowed_congestion_control ({_proc_sys('tcp_allowed_congestion_control')}); "
                   "add it there on the node, or run the role with CAP_NET_ADMIN")
        else:
            fix = (f"this kernel has {available or 'none listed'} "
                   f"(net.ipv4.tcp_available_congestion_control; `modprobe tcp_{name}` "
                   "may add it)")
        raise base.TransportError(
            f"spec.transport.tcpCongestionControl={name!r}: the kernel refused it "
            f"({err.strerror}); {fix}") from err


def congestion_control_of(sock: socket.socket) -> str:
    """The congestion control ``sock`` uses."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
    return raw.split(b"\0", 1)[0].decode()


def _proc_sys(key: str) -> str:
    try:
        return Path("/proc/sys/net/ipv4", key).read_text().strip()
    except OSError:
        return ""
