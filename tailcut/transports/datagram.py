"""Datagram transports: `udp` (no guarantee) and `bounded-loss` (at least p of every message).

A message's float32 vector is cut into range-indexed UDP packets (wire.py), sent in a
random slot order (so what is lost or left out is spread over the vector) and paced
at ``rate_mbit`` or, if unset, the rate of the HTB class on the sending interface.
Everything else goes over a TCP control channel (control.py). Per message:

    sender                               receiver
    BEGIN (id, kind, iteration, total) ->  allocate vector + mask
    packets, random slot order        ->  XDP counts each slot once; the socket fills
                                          the vector; at p * total the XDP program
                                          emits a ring-buffer event
                                      <-  DONE as soon as the event is in and the
                                          socket has delivered >= p (or everything)
    stop sending at DONE
    END after a pass                  ->  if still below p once the pass has drained:
                                      <-  NACK with the missing slots
    retransmit them (flag RETX), END  ->  ... until p

``udp`` sends one pass and never retransmits; the receiver completes once the pass is
drained (read up to END's arrival, see ``_sweep``) with whatever arrived. The receiver
hands the application the vector and a mask of what arrived (None if everything
did); the PS averages each coordinate over the workers that delivered it.

The XDP counter is attached by the receiving process itself (listen or connect), on
the interface that holds its address, in generic mode unless ``xdp_mode`` says
otherwise, and detached by ``close``; a process killed with -9 leaves it on the
pod's veth, which goes away with the pod's namespace.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import queue
import socket
import struct
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tailcut.transports import base, control, wire
from tailcut.transports import batch as batch_mod
from tailcut.transports.base import Kind, Message
from tailcut.transports.control import Frame, FrameType

log = logging.getLogger(__name__)

# <asm-generic/socket.h>; Python 3.11 does not export the FORCE variants.
_BUFFER_OPTS = {33: socket.SO_RCVBUF, 32: socket.SO_SNDBUF}  # FORCE -> plain
SOCKET_BUFFER_BYTES = 32 << 20
SO_TIMESTAMPNS = 35  # <asm-generic/socket.h>; also the SCM type of the timestamp
_TIMESPEC = struct.Struct("@qq")  # struct timespec on 64-bit Linux
ETH_BYTES = 14  # what HTB counts on top of the IP packet
BURST_PACKETS = 16  # packets sent between two checks of the clock and of DONE
MAX_SLOTS = wire.const("MAX_SLOTS")
# Packets kept for messages whose BEGIN has not been read yet (the control channel can
# lag the data); beyond this they are dropped and recovered as losses.
STASH_PACKETS = 16384
FINISHED_REMEMBERED = 4096
_CONNECT_RETRY_S = 0.1


@dataclass
class _Rx:
    """One message being received."""

    conn: DatagramConnection
    message: int
    kind: int
    iteration: int
    sender: int
    total: int
    sent_at_ns: int
    threshold: int
    values: np.ndarray
    mask: np.ndarray
    seen: np.ndarray
    count: int = 0
    wire_bytes: int = 0
    fired: bool = False
    event_ns: int = 0
    end_at: float | None = None  # monotonic time the last END was read (None: no pass)
    end_ns: int = 0  # the same moment, CLOCK_REALTIME, to compare with packet timestamps
    begun_ns: int = field(default_factory=time.monotonic_ns)


@dataclass(frozen=True)
class _Done:
    """What to do for a message once the lock is released: deliver it, or NACK."""

    rx: _Rx
    reason: str  # full | xdp | p | end | nack
    missing: bytes = b""  # NACK: the missing slots as big-endian u32s


@dataclass
class _Tx:
    """One message being sent: frames from the receiver (DONE, NACK) arrive here."""

    frames: queue.Queue[Frame | BaseException] = field(default_factory=queue.Queue)
    done: threading.Event = field(default_factory=threading.Event)


class DatagramConnection(base.Connection):
    """One peer: a control channel plus the peer's UDP address."""

    def __init__(self, transport: DatagramTransport, channel: control.Channel, peer_id: int,
                 udp_addr: tuple[str, int]) -> None:
        self.transport = transport
        self.channel = channel
        self.peer = channel.peer
        self.peer_id = peer_id
        self.udp_addr = udp_addr
        self.inbox: queue.Queue[tuple[Message, dict[str, Any] | None] | BaseException] = \
            queue.Queue()
        self.tx: dict[int, _Tx] = {}
        self._counter = 0
        self._closed = False
        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                        name=f"ctrl-{peer_id}")
        self._reader.start()

    def _next_id(self) -> int:
        self._counter = (self._counter + 1) & 0xFFFF
        return (self.peer_id << 16) | self._counter

    def send(self, msg: Message, timeout_s: float | None = None) -> None:
        if self._closed:
            raise base.PeerClosed(f"connection to {self.peer} is closed")
        sent_at = msg.sent_at_ns or time.time_ns()
        if int(msg.kind) not in wire.DATA_KINDS or msg.values.size == 0:
            self.channel.send(Frame(FrameType.MSG, int(msg.kind), 0, msg.iteration, msg.sender,
                                    0, sent_at))
            return
        self.transport._send_data(self, msg, sent_at, base.deadline_after(timeout_s))

    def recv(self, timeout_s: float | None = None) -> Message:
        try:
            item = self.inbox.get(timeout=timeout_s)
        except queue.Empty:
            raise base.TransportTimeout(f"no message from {self.peer} within {timeout_s} s") \
                from None
        if isinstance(item, BaseException):
            self.inbox.put(item)  # every later recv fails the same way
            raise item
        msg, record = item
        if record is not None:
            record["app_ns"] = time.monotonic_ns()
        return msg

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.channel.close()
        self.transport._forget_conn(self)

    def _read_loop(self) -> None:
        err: BaseException
        try:
            while True:
                frame = self.channel.read()
                self.transport._on_frame(self, frame)
        except base.TransportError as e:
            err = e
        except Exception as e:  # our bug: make it visible to the receiving thread
            log.exception("control reader for %s failed", self.peer)
            err = base.TransportError(f"{self.peer}: control reader failed: {e!r}")
        self.inbox.put(err)
        for tx in list(self.tx.values()):
            tx.frames.put(err)


class DatagramTransport(base.Transport):
    """Range-indexed UDP data plus a TCP control channel; see the module docstring."""

    name = "udp"
    bounded = False

    def __init__(self, job: str = "tailcut", mtu: int = wire.DEFAULT_MTU,
                 rate_mbit: float | None = None, end_grace_ms: float = 2.0,
                 max_elements: int = wire.DEFAULT_MAX_ELEMENTS, seed: int | None = None) -> None:
        super().__init__()
        if rate_mbit is not None and not (isinstance(rate_mbit, (int, float)) and rate_mbit > 0):
            raise ValueError(f"rate_mbit={rate_mbit!r}: must be > 0, or unset for the link's rate")
        if not 0 <= end_grace_ms <= 10_000:
            raise ValueError(f"end_grace_ms={end_grace_ms}: must be in [0, 10000]")
        self.job = job
        self.job_id = wire.job_id(job)
        self.stride = wire.elements_per_packet(mtu)
        self.rate_mbit = rate_mbit
        self.end_grace_s = end_grace_ms / 1e3
        self.max_elements = max_elements
        self.p = 1.0
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._rx: dict[int, _Rx] = {}
        self._stash: dict[int, list[tuple[bytes, str]]] = {}
        self._stashed = 0
        self._early_fired: dict[int, int] = {}
        self._finished: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._by_peer: dict[int, DatagramConnection] = {}
        self._udp: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._running = False
        self._pace_bit: float | None = None
        self._read_up_to_ns = 0  # kernel arrival time (CLOCK_REALTIME) of the last datagram read
        self.counter: Any = None  # tailcut.datapath.partial.Counter when XDP is on
        self.stats: collections.Counter[str] = collections.Counter()
        self.completions: collections.deque[dict[str, Any]] = collections.deque(maxlen=100_000)

    # ---- setup ----------------------------------------------------------------------

    def listen(self, host: str, port: int, count: int, timeout_s: float) -> list[base.Connection]:
        deadline = base.deadline_after(timeout_s)
        self._open_udp(host, port)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        conns: list[base.Connection] = []
        try:
            try:
                listener.bind((host, port))
            except OSError as err:
                raise base.TransportError(f"cannot listen on {host}:{port}: {err.strerror}") \
                    from err
            listener.listen(count)
            while len(conns) < count:
                listener.settimeout(max(base.remaining(deadline) or 0.0, 1e-6))
                try:
                    sock, addr = listener.accept()
                except TimeoutError:
                    raise base.TransportTimeout(
                        f"only {len(conns)} of {count} peers connected to {host}:{port} "
                        f"within {timeout_s} s") from None
                sock.settimeout(max(base.remaining(deadline) or 0.0, 1e-6))
                channel = control.Channel(sock, f"{addr[0]}:{addr[1]}")
                try:
                    hello = channel.read()
                except TimeoutError:
                    channel.close()
                    raise base.TransportTimeout(f"{channel.peer} sent no SETUP in time") from None
                if hello.type != FrameType.SETUP or not 1 <= hello.count <= 65535:
                    channel.close()
                    raise base.ProtocolError(f"{channel.peer}: expected SETUP with a UDP port, "
                                             f"got {hello.type.name} count={hello.count}")
                peer_id = len(conns) + 1
                channel.send(Frame(FrameType.SETUP, message=peer_id))
                sock.settimeout(None)
                conns.append(self._add_conn(channel, peer_id, (addr[0], hello.count)))
            self._start(host)
        except BaseException:
            for conn in conns:
                conn.close()
            self.close()
            raise
        finally:
            listener.close()
        return conns

    def connect(self, host: str, port: int, timeout_s: float) -> base.Connection:
        deadline = base.deadline_after(timeout_s)
        sock = _connect_tcp(host, port, deadline, timeout_s)
        local_ip = sock.getsockname()[0]
        try:
            self._open_udp(local_ip, 0)
            assert self._udp is not None
            self._start(local_ip)
            channel = control.Channel(sock, f"{host}:{port}")
            sock.settimeout(max(base.remaining(deadline) or 0.0, 1e-6))
            channel.send(Frame(FrameType.SETUP, count=self._udp.getsockname()[1]))
            try:
                reply = channel.read()
            except TimeoutError:
                raise base.TransportTimeout(f"{host}:{port} did not answer SETUP in time") \
                    from None
            if reply.type != FrameType.SETUP or not 1 <= reply.message <= 0xFFFF:
                raise base.ProtocolError(f"{host}:{port}: expected SETUP with a peer id, got "
                                         f"{reply.type.name} message={reply.message}")
            sock.settimeout(None)
            return self._add_conn(channel, reply.message, (host, port))
        except BaseException:
            sock.close()
            self.close()
            raise

    def _open_udp(self, host: str, port: int) -> None:
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            # Force big buffers past net.core.*mem_max (the roles run as root): a full
            # socket buffer would be loss the link did not cause.
            for force, plain in _BUFFER_OPTS.items():
                try:
                    udp.setsockopt(socket.SOL_SOCKET, force, SOCKET_BUFFER_BYTES)
                except PermissionError:
                    udp.setsockopt(socket.SOL_SOCKET, plain, SOCKET_BUFFER_BYTES)
            udp.bind((host, port))
        except OSError as err:
            udp.close()
            raise base.TransportError(f"cannot bind UDP {host}:{port}: {err.strerror}") from err
        # Kernel receive timestamps tell the receive loop how far it has read (see _sweep).
        udp.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        udp.settimeout(0.002)
        self._udp = udp

    def _start(self, local_ip: str) -> None:
        """Attach the XDP counter (bounded-loss) and start the receive threads."""
        assert self._udp is not None
        self._pace_bit = (self.rate_mbit * 1e6 if self.rate_mbit is not None
                          else _link_rate_bit(local_ip))
        self._attach(local_ip, self._udp.getsockname()[1])
        self._running = True
        self._threads.append(threading.Thread(target=self._udp_loop, daemon=True,
                                              name="udp-rx"))
        if self.counter is not None:
            self._threads.append(threading.Thread(target=self._event_loop, daemon=True,
                                                  name="xdp-events"))
        for t in self._threads:
            t.start()

    def _attach(self, local_ip: str, port: int) -> None:
        """The udp transport counts nothing in XDP; bounded-loss overrides this."""

    def _add_conn(self, channel: control.Channel, peer_id: int,
                  udp_addr: tuple[str, int]) -> DatagramConnection:
        conn = DatagramConnection(self, channel, peer_id, udp_addr)
        with self._lock:
            self._by_peer[peer_id] = conn
        return conn

    def _forget_conn(self, conn: DatagramConnection) -> None:
        with self._lock:
            if self._by_peer.get(conn.peer_id) is conn:
                del self._by_peer[conn.peer_id]

    def gather(self, conns: Sequence[base.Connection],
               timeout_s: float | None) -> list[Message]:
        """One message from each connection. No reader threads needed: the receive
        threads complete (and time-stamp) messages in the background, recv only
        collects them."""
        deadline = base.deadline_after(timeout_s)
        return [c.recv(base.remaining(deadline)) for c in conns]

    def close(self) -> None:
        super().close()
        self._running = False
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=2.0)
        self._threads = []
        if self._udp is not None:
            self._udp.close()
            self._udp = None
        if self.counter is not None:
            self.counter.detach()
            self.counter = None

    # ---- sending --------------------------------------------------------------------

    def _send_data(self, conn: DatagramConnection, msg: Message, sent_at: int,
                   deadline: float | None) -> None:
        values = np.ascontiguousarray(msg.values, dtype=wire.VALUE_DTYPE).reshape(-1)
        total = values.size
        n_slots = wire.slots(total, self.stride)
        if total > self.max_elements or n_slots > MAX_SLOTS:
            raise ValueError(f"message of {total} values: at most "
                             f"{min(self.max_elements, MAX_SLOTS * self.stride)} "
                             f"({MAX_SLOTS} packets of {self.stride})")
        mid = conn._next_id()
        tx = conn.tx[mid] = _Tx()
        try:
            conn.channel.send(Frame(FrameType.BEGIN, int(msg.kind), mid, msg.iteration,
                                    msg.sender, total, sent_at))
            rows, lengths = _packetize(values, self.job_id, mid, int(msg.kind), self.stride)
            order = self._rng.permutation(n_slots)
            seq = self._pace(conn, rows, lengths, order, 0, 0, tx, deadline)
            if tx.done.is_set():
                return
            conn.channel.send(Frame(FrameType.END, message=mid, count=len(order)))
            if not self.bounded:
                return
            while True:
                try:
                    frame = tx.frames.get(timeout=base.remaining(deadline))
                except queue.Empty:
                    raise base.TransportTimeout(
                        f"{conn.peer} did not confirm p={self.p} of message {mid:#x} in time") \
                        from None
                if isinstance(frame, BaseException):
                    raise frame
                if frame.type == FrameType.DONE:
                    return
                missing = np.unique(np.frombuffer(frame.extra, dtype=">u4").astype(np.int64))
                missing = missing[missing < n_slots]
                self._rng.shuffle(missing)
                self.stats["retransmitted"] += len(missing)
                seq = self._pace(conn, rows, lengths, missing, seq, wire.F_RETX, tx, deadline)
                if tx.done.is_set():
                    return
                conn.channel.send(Frame(FrameType.END, message=mid, count=len(missing)))
        finally:
            del conn.tx[mid]

    def _pace(self, conn: DatagramConnection, rows: np.ndarray, lengths: np.ndarray,
              order: np.ndarray, seq: int, flags: int, tx: _Tx, deadline: float | None) -> int:
        """Send ``rows[order]`` with seq numbers from ``seq``, at the pacing rate; stop
        early at DONE. Returns the next seq."""
        udp = self._udp
        assert udp is not None
        hdr = rows["h"]
        if len(order):
            hdr["seq"][order] = seq + np.arange(len(order))
            hdr["flags"][order] = flags
            hdr["flags"][order[-1]] = flags | wire.F_LAST
        raw = rows.view(np.uint8).reshape(len(rows), -1)
        rate = self._pace_bit
        started = time.monotonic()
        wire_bits = 0
        # sendmmsg sends a burst per system call; a socket wrapped by a test (to drop
        # datagrams) or a libc without it takes the per-datagram path.
        batch = (batch_mod.Batch(udp, raw, lengths, order, conn.udp_addr)
                 if batch_mod.available() and isinstance(udp, socket.socket) else None)
        for first in range(0, len(order), BURST_PACKETS):
            burst = order[first:first + BURST_PACKETS]
            if batch is not None:
                batch.send(first, len(burst))
            else:
                for slot in burst:
                    udp.sendto(raw[slot, :int(lengths[slot])], conn.udp_addr)
            wire_bits += 8 * int(lengths[burst].sum() + len(burst) * (wire.IP_UDP_BYTES
                                                                      + ETH_BYTES))
            if tx.done.is_set():
                return seq + first + len(burst)
            if deadline is not None and time.monotonic() > deadline:
                raise base.TransportTimeout(f"sending to {conn.peer} ran out of time")
            if rate:
                ahead = started + wire_bits / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        self.stats["packets_sent"] += len(order)
        return seq + len(order)

    # ---- receiving ------------------------------------------------------------------

    def _on_frame(self, conn: DatagramConnection, frame: Frame) -> None:
        """Called by a connection's control reader thread."""
        if frame.type == FrameType.MSG:
            if frame.kind not in {int(k) for k in Kind}:
                raise base.ProtocolError(f"{conn.peer}: MSG of unknown kind {frame.kind}")
            msg = Message(Kind(frame.kind), frame.iteration, frame.sender,
                          sent_at_ns=frame.sent_at_ns, received_at_ns=time.time_ns(),
                          wire_bytes=control.HEADER.size)
            conn.inbox.put((msg, None))
        elif frame.type == FrameType.BEGIN:
            self._begin(conn, frame)
        elif frame.type == FrameType.END:
            with self._lock:
                rx = self._rx.get(frame.message)
                if rx is not None and rx.conn is conn:
                    rx.end_at = time.monotonic()
                    rx.end_ns = time.time_ns()
        elif frame.type in (FrameType.DONE, FrameType.NACK):
            tx = conn.tx.get(frame.message)
            if tx is not None:
                if frame.type == FrameType.DONE:
                    tx.done.set()
                tx.frames.put(frame)
        else:
            raise base.ProtocolError(f"{conn.peer}: unexpected {frame.type.name} frame")

    def _begin(self, conn: DatagramConnection, f: Frame) -> None:
        if f.kind not in wire.DATA_KINDS:
            raise base.ProtocolError(f"{conn.peer}: BEGIN of kind {f.kind}; data is PUSH/PARAMS")
        if not 1 <= f.count <= self.max_elements or wire.slots(f.count, self.stride) > MAX_SLOTS:
            raise base.ProtocolError(f"{conn.peer}: BEGIN total {f.count} elements is out of "
                                     f"range 1..{min(self.max_elements, MAX_SLOTS * self.stride)}")
        if f.message >> 16 != conn.peer_id:
            raise base.ProtocolError(f"{conn.peer}: message id {f.message:#x} is not of peer "
                                     f"{conn.peer_id}")
        total = f.count
        threshold = threshold_elements(self.p, total)
        rx = _Rx(conn, f.message, f.kind, f.iteration, f.sender, total, f.sent_at_ns,
                 threshold, np.zeros(total, wire.VALUE_DTYPE), np.zeros(total, bool),
                 np.zeros(wire.slots(total, self.stride), bool))
        done: list[_Done] = []
        with self._lock:
            if f.message in self._rx:
                raise base.ProtocolError(f"{conn.peer}: BEGIN of message {f.message:#x} twice")
            self._finished.pop(f.message, None)
            self._rx[f.message] = rx
            if self._early_fired.pop(f.message, None) is not None:
                rx.fired = True
            for data, src in self._stash.pop(f.message, []):
                self._stashed -= 1
                self._accept(data, src, done)
            self._check(rx, done)
        self._finish(done)

    def _udp_loop(self) -> None:
        buf = bytearray(65536)
        view = memoryview(buf)
        udp = self._udp
        assert udp is not None
        ancillary = socket.CMSG_SPACE(_TIMESPEC.size)
        next_sweep = 0.0
        while self._running:
            done: list[_Done] = []
            try:
                n, anc, _flags, addr = udp.recvmsg_into([buf], ancillary)
            except TimeoutError:
                n = -1
                # The socket is empty: everything that arrived until now has been read.
                self._read_up_to_ns = time.time_ns()
            except OSError:
                break  # closed
            else:
                for level, kind, data in anc:
                    if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS \
                            and len(data) >= _TIMESPEC.size:
                        sec, nsec = _TIMESPEC.unpack_from(data)
                        self._read_up_to_ns = sec * 1_000_000_000 + nsec
            now = time.monotonic()
            with self._lock:
                if n >= 0:
                    self._accept(view[:n], addr[0], done)
                if now >= next_sweep:
                    self._sweep(now, done)
                    next_sweep = now + 0.001
            self._finish(done)

    def _accept(self, data: memoryview | bytes, src: str, done: list[_Done]) -> None:
        """Check one datagram and put its values in place. Holds self._lock."""
        try:
            pkt = wire.parse(data, self.max_elements)
        except wire.BadPacket as err:
            self.stats["bad_packet"] += 1
            self.stats[f"bad_packet: {str(err).split(':')[0]}"] += 1
            return
        if pkt.job != self.job_id:
            self.stats["unknown_job"] += 1
            return
        rx = self._rx.get(pkt.message)
        if rx is None:
            if pkt.message in self._finished:
                self.stats["late"] += 1
                return
            conn = self._by_peer.get(pkt.message >> 16)
            if conn is None or conn.udp_addr[0] != src:
                self.stats["unknown_message"] += 1
                return
            if self._stashed >= STASH_PACKETS:
                self.stats["stash_full"] += 1
                return
            self._stash.setdefault(pkt.message, []).append((bytes(data), src))
            self._stashed += 1
            return
        if src != rx.conn.udp_addr[0]:
            self.stats["foreign_source"] += 1
            return
        if pkt.total != rx.total or pkt.kind != rx.kind:
            self.stats["mismatch"] += 1
            return
        slot, rem = divmod(pkt.start, self.stride)
        if rem or pkt.end != min(pkt.start + self.stride, rx.total):
            self.stats["misaligned"] += 1
            return
        if rx.seen[slot]:
            self.stats["duplicate"] += 1
            return
        rx.seen[slot] = True
        rx.values[pkt.start:pkt.end] = pkt.values
        rx.mask[pkt.start:pkt.end] = True
        rx.count += pkt.elements
        rx.wire_bytes += len(data)
        self.stats["accepted"] += 1
        self._check(rx, done)

    def _check(self, rx: _Rx, done: list[_Done]) -> None:
        """Complete ``rx`` if it may be. Holds self._lock."""
        if rx.message not in self._rx:
            return
        if rx.count == rx.total:
            reason = "full"
        elif self.bounded and rx.count >= rx.threshold and (rx.fired or self.counter is None):
            reason = "xdp" if rx.fired else "p"
        else:
            return
        del self._rx[rx.message]
        self._finished[rx.message] = None
        while len(self._finished) > FINISHED_REMEMBERED:
            self._finished.popitem(last=False)
        done.append(_Done(rx, reason))

    def _sweep(self, now: float, done: list[_Done]) -> None:
        """Passes that ended: complete (udp, or p without an XDP event) or NACK. Holds
        self._lock."""
        for rx in list(self._rx.values()):
            # A pass is drained once the socket has been read up to END's arrival: the
            # sender sent END after the pass's last packet, over the same FIFO path, so
            # a datagram that reached the kernel after END was read means every packet
            # of the pass that survived has been read too. The grace covers reordering
            # between CPUs.
            if rx.end_at is None or self._read_up_to_ns < rx.end_ns \
                    or now - rx.end_at < self.end_grace_s:
                continue
            rx.end_at = None
            if not self.bounded or rx.count >= rx.threshold:
                del self._rx[rx.message]
                self._finished[rx.message] = None
                done.append(_Done(rx, "end"))
            else:
                missing = np.flatnonzero(~rx.seen).astype(">u4")
                self.stats["nacks"] += 1
                done.append(_Done(rx, "nack", missing.tobytes()))

    def _finish(self, done: list[_Done]) -> None:
        """Deliver completed messages and send DONE/NACK, outside the lock."""
        for d in done:
            rx, reason = d.rx, d.reason
            try:
                if reason == "nack":
                    rx.conn.channel.send(Frame(FrameType.NACK, message=rx.message,
                                               count=len(d.missing) // 4, extra=d.missing))
                    continue
                if self.bounded:
                    rx.conn.channel.send(Frame(FrameType.DONE, message=rx.message,
                                               count=rx.count))
            except base.TransportError:
                pass  # the peer is gone; its reader thread reports it to recv()
            if self.counter is not None:
                self.counter.forget(rx.message, self.job_id)
            full = rx.count == rx.total
            record = {"message": rx.message, "reason": reason, "total": rx.total,
                      "delivered": rx.count, "event_ns": rx.event_ns,
                      "done_ns": time.monotonic_ns(), "begun_ns": rx.begun_ns}
            self.completions.append(record)
            msg = Message(Kind(rx.kind), rx.iteration, rx.sender, rx.values,
                          None if full else rx.mask, rx.sent_at_ns, time.time_ns(),
                          rx.wire_bytes)
            rx.conn.inbox.put((msg, record))

    def _event_loop(self) -> None:
        next_sweep = 0.0
        while self._running:
            counter = self.counter
            if counter is None:
                return
            events = counter.poll(50)
            if time.monotonic() >= next_sweep:
                # Packets still in flight after DONE (the sender stops a little late)
                # re-create a finished message's entry: free those again.
                with self._lock:
                    stale = [m for m in counter.messages() if m in self._finished]
                for m in stale:
                    counter.forget(m, self.job_id)
                next_sweep = time.monotonic() + 0.1
            done: list[_Done] = []
            with self._lock:
                for ev in events:
                    if ev.job != self.job_id:
                        continue
                    rx = self._rx.get(ev.message)
                    if rx is None:
                        if ev.message not in self._finished:
                            self._early_fired[ev.message] = ev.ktime_ns
                            while len(self._early_fired) > FINISHED_REMEMBERED:
                                self._early_fired.pop(next(iter(self._early_fired)))
                        continue
                    rx.fired = True
                    rx.event_ns = ev.ktime_ns
                    self._check(rx, done)
            self._finish(done)


class BoundedLossTransport(DatagramTransport):
    """At least a fraction p of every message, fast; the rest is ignored."""

    name = "bounded-loss"
    bounded = True

    def __init__(self, p: float = 0.9, job: str = "tailcut", mtu: int = wire.DEFAULT_MTU,
                 rate_mbit: float | None = None, xdp: bool = True,
                 xdp_mode: str = "generic", end_grace_ms: float = 2.0,
                 max_elements: int = wire.DEFAULT_MAX_ELEMENTS, seed: int | None = None) -> None:
        super().__init__(job=job, mtu=mtu, rate_mbit=rate_mbit, end_grace_ms=end_grace_ms,
                         max_elements=max_elements, seed=seed)
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ValueError(f"p={p!r}: must be a fraction in (0, 1] (0.9 = deliver at least "
                             "90% of every message)")
        if xdp_mode not in ("generic", "native"):
            raise ValueError(f"xdp_mode={xdp_mode!r}: must be generic or native")
        self.p = float(p)
        self.xdp = xdp
        self.xdp_mode = xdp_mode

    def _attach(self, local_ip: str, port: int) -> None:
        if not self.xdp:
            return
        from tailcut.datapath import partial
        from tailcut.errors import DatapathError
        try:
            self.counter = partial.attach(_ifname_of(local_ip), port=port, job=self.job_id,
                                          p=self.p, stride=self.stride,
                                          mode=self.xdp_mode)  # type: ignore[arg-type]
        except DatapathError as err:
            raise base.TransportError(f"bounded-loss receiver on {local_ip}:{port}: {err}") \
                from err
        # Said on stderr, which the runtime keeps in logs/<pod>.log: which mode is in use.
        print(f"tailcut bounded-loss: XDP counter attached to {self.counter.ifname} in "
              f"{self.counter.mode} mode (prog id {self.counter.prog_id}, p={self.p}, "
              f"{self.stride} floats per packet)", file=sys.stderr, flush=True)


class UdpTransport(DatagramTransport):
    """One pass of range-indexed UDP packets; no retransmission, no guarantee."""

    name = "udp"


# ---- helpers --------------------------------------------------------------------------


def threshold_elements(p: float, total: int) -> int:
    """ceil(p * total), at least 1, computed exactly as the XDP program does (p in ppm)."""
    ppm = max(1, round(p * 1_000_000))
    return max(1, (total * ppm + 999_999) // 1_000_000)


def _packetize(values: np.ndarray, job: int, message: int, kind: int,
               stride: int) -> tuple[np.ndarray, np.ndarray]:
    """Every packet of ``values`` at once: a record array of (header, stride floats)
    rows, and each row's datagram length (the last one may be short)."""
    total = values.size
    n = wire.slots(total, stride)
    rows = np.zeros(n, dtype=[("h", _header_dtype()), ("v", wire.VALUE_DTYPE, (stride,))])
    padded = np.zeros(n * stride, wire.VALUE_DTYPE)
    padded[:total] = values
    rows["v"] = padded.reshape(n, stride)
    starts = np.arange(n, dtype=np.int64) * stride
    ends = np.minimum(starts + stride, total)
    h = rows["h"]
    h["magic"], h["version"], h["kind"] = wire.MAGIC, wire.VERSION, kind
    h["job"], h["message"], h["total"] = job, message, total
    h["start"], h["end"] = starts, ends
    lengths = wire.HEADER_BYTES + 4 * (ends - starts)
    return rows, lengths


def _header_dtype() -> np.dtype:
    """The wire header as a numpy dtype, from the ctypes view of ebpf/partial.h."""
    hdr = wire.header_type()
    sizes = {1: "u1", 2: ">u2", 4: ">u4", 8: ">u8"}
    names, formats, offsets = [], [], []
    for name, ctype in hdr._fields_:
        names.append(name)
        formats.append(sizes[ctypes.sizeof(ctype)])
        offsets.append(getattr(hdr, name).offset)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                     "itemsize": wire.HEADER_BYTES})


def _connect_tcp(host: str, port: int, deadline: float | None, timeout_s: float) -> socket.socket:
    last: OSError | None = None
    while True:
        left = base.remaining(deadline) or 0.0
        try:
            sock = socket.create_connection((host, port), timeout=max(min(left, 1.0), 0.01))
            return sock
        except OSError as err:
            last = err
        if (base.remaining(deadline) or 0.0) <= _CONNECT_RETRY_S:
            raise base.TransportTimeout(f"could not connect to {host}:{port} within {timeout_s} s "
                                        f"(last error: {last})")
        time.sleep(_CONNECT_RETRY_S)


def _ifname_of(ip: str) -> str:
    """The interface in this network namespace that holds address ``ip``."""
    from pyroute2 import IPRoute
    with IPRoute() as ipr:
        for addr in ipr.get_addr(family=socket.AF_INET):
            if addr.get_attr("IFA_ADDRESS") == ip:
                return str(ipr.get_links(addr["index"])[0].get_attr("IFLA_IFNAME"))
    raise base.TransportError(f"no interface holds {ip} in this network namespace")


def _link_rate_bit(ip: str) -> float | None:
    """The rate of the HTB link class (1:1) on the interface holding ``ip``, or None
    (unshaped: send as fast as the CPU allows)."""
    from pyroute2 import IPRoute
    try:
        ifname = _ifname_of(ip)
        with IPRoute() as ipr:
            index = ipr.link_lookup(ifname=ifname)[0]
            for cls in ipr.get_classes(index):
                if cls["handle"] != 0x10001 or cls.get_attr("TCA_KIND") != "htb":
                    continue
                opts = cls.get_attr("TCA_OPTIONS")
                rate64 = opts.get_attr("TCA_HTB_RATE64")
                parms = opts.get_attr("TCA_HTB_PARMS")
                rate = rate64 or (parms["rate"] if parms else 0)
                return float(rate) * 8 if rate else None
    except Exception as err:  # no such interface or an unreadable class: do not pace
        log.debug("no link rate for %s: %s", ip, err)
    return None
