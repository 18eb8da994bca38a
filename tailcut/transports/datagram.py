"""Datagram transports: `udp` (no guarantee) and `bounded-loss` (at least p of every message).

A message's float32 vector is cut into range-indexed UDP packets (wire.py), sent in a
random slot order (so what is lost or left out is spread over the vector) and paced
at ``rate_bit`` (bits per second) or, if unset, the rate of the HTB class on the
sending interface.
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

With ``min_p`` below p (early close, docs/bounded-loss.md) a message below p whose
pass's LAST packet is in and whose packets have stopped coming is handed over with
what arrived, if at least min_p, instead of NACKed (``receiver.Receiver.sweep``).

``udp`` sends one pass and never retransmits; the receiver completes once the pass is
drained (read up to END's arrival, see ``receiver.Receiver.sweep``) with whatever
arrived. The receiver hands the application the vector and a mask of what arrived
(None if everything did); the PS averages each coordinate over the workers that
delivered it.

CadentFlow (``DatagramConnection.cuts``, set by tailcut.training.flows.tag): a tagged
message is laid out cut by cut on slot boundaries (cutlayout.py; the BEGIN frame
carries the cut table) and sent most urgent cut first, random slot order within a
cut, every datagram with its cut's IP_TOS (a cmsg per datagram of the sendmmsg
batch); a pass ends with one END per class it used. The receiver delivers the
message with one ``base.Part`` per cut, timed when the cut's last slot arrived.
Bounded-loss still stops at p of the *whole* message, so what is left out falls on
the least urgent cuts (docs/bounded-loss.md, "Under CadentFlow").

This module does the I/O and the threads: packets are built and paced by sender.py,
read by one thread a batch at a time (``recvmmsg``, batch.py) and checked and put in
place by receiver.py, which also tells this module what to deliver, DONE or NACK.
The same thread reads the XDP counter's events right after each batch, so a message
completes in the pass of the loop that reads its crossing packet.

The XDP counter is attached by the receiving process itself (listen or connect), on
the interface that holds its address, in generic mode unless ``xdp_mode`` says
otherwise, and detached by ``close``; a process killed with -9 leaves it on the
pod's veth, which goes away with the pod's namespace.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import queue
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from tailcut.spec import fraction
from tailcut.transports import (base, batch, congestion, control, cutlayout, interfaces,
                                receiver, sender, srpt, wire)
from tailcut.transports.base import Kind, Message
from tailcut.transports.control import Frame, FrameType

log = logging.getLogger(__name__)

# <asm-generic/socket.h>; Python 3.11 does not export the FORCE variants.
_BUFFER_OPTS = {33: socket.SO_RCVBUF, 32: socket.SO_SNDBUF}  # FORCE -> plain
SOCKET_BUFFER_BYTES = 32 << 20
MAX_SLOTS = wire.const("MAX_SLOTS")
RECV_BATCH = 128  # messages (datagrams, or whole GSO messages) read per recvmmsg call at most
# While a message is coming in, the receive loop lets packets gather between reads
# rather than pay a batch's fixed cost (tens to hundreds of us of numpy calls, and a
# wake-up of the thread, which on a busy machine waits for a core) on every one or two
# of them. With the XDP counter it reads when a message crosses p (its event), at END
# and when the link's counter is sampled: the socket's buffer (SOCKET_BUFFER_BYTES)
# holds what gathers meanwhile, if it got at least DEEP_SOCKET_BYTES and four samples'
# worth of the link (else, on an unshaped link with no samples, and under early
# close, which watches a pass's last packet and the quiet after it, the loop also
# reads every COALESCE_MS). Without the counter it sleeps
# COALESCE_S after a batch of fewer than COALESCE_PACKETS. 1 ms at 1 Gbit/s is 83
# packets, within one read.
COALESCE_MS = 1
# SO_RCVBUF as the kernel reports it (twice what was set): 8 MiB holds ~3,500 full
# datagrams (~2.3 KB each in the kernel), a dozen 259 KB messages.
DEEP_SOCKET_BYTES = 8 << 20
COALESCE_PACKETS = 16
COALESCE_S = 0.0002
IDLE_WAIT_S = 0.1  # longest sleep with nothing due (close and END also wake the loop)
IDLE_SAMPLE_S = 0.05  # the link's counter is read this often while nothing comes in
UDP_LINGER_S = 2.0  # how long a udp connection's close waits for its queued passes
STALE_DELAY_S = 0.02  # after a completion, when its XDP entry is freed (late packets in)
# The kernel receive path (receive_path="kernel", tailcut.datapath.rxring): messages of up
# to KERNEL_RANGES packets (92,160 floats at a 1500-byte MTU, a 368 KB message), of
# which KERNEL_REGIONS are placed at once: 11.8 MB of locked kernel memory. A larger
# message, or one more, comes through the socket.
RECEIVE_PATHS = ("socket", "kernel")
KERNEL_RANGES = 256
KERNEL_REGIONS = 32
# A bounded-loss pass over before DONE waits this long for it before sending END (which
# a NACK then follows end_grace_ms later, if below p).
END_WAIT_S = 0.002

# Kept here for callers that knew them in this module.
threshold_elements = receiver.threshold_elements


@dataclass
class _Tx:
    """One message being sent: frames from the receiver (DONE, NACK) arrive here, and
    its grants (congestion.py): the latest, and the lowest, which the connection's next
    message starts at."""

    frames: queue.SimpleQueue[Frame | BaseException] = field(default_factory=queue.SimpleQueue)
    done: threading.Event = field(default_factory=threading.Event)
    grant_bit: float | None = None
    lowest_grant_bit: float | None = None

    def grant(self, rate_bit: float) -> None:
        self.grant_bit = rate_bit
        if self.lowest_grant_bit is None or rate_bit < self.lowest_grant_bit:
            self.lowest_grant_bit = rate_bit


@dataclass
class _Outgoing:
    """A message whose BEGIN is sent, waiting for the connection's sender thread."""

    message: int
    values: np.ndarray  # the sender's copy, laid out for the wire
    kind: int
    order: np.ndarray
    tos: np.ndarray | None
    layout: cutlayout.Layout | None
    tx: _Tx
    deadline: float | None


_KINDS = frozenset(int(k) for k in Kind)  # what a MSG frame may carry

# What a connection receives: a message (with its completion record, for bounded
# loss) or the failure that ends it.
_Item = tuple[Message, dict[str, Any] | None] | BaseException
# Where a role takes what a connection receives as it comes in (DatagramConnection.
# attach): (message, None) or (None, failure); False once it wants no more.
Sink = Callable[[Message | None, BaseException | None], bool]


def _taken(item: tuple[Message, dict[str, Any] | None]) -> Message:
    """A received message as the role takes it: its completion record says when."""
    msg, record = item
    if record is not None:
        record["app_ns"] = time.monotonic_ns()
    return msg


class DatagramConnection(base.Connection):
    """One peer: a control channel plus the peer's UDP address.

    CadentFlow (as ``tcp.TcpConnection``): a message of a kind in ``cuts`` whose size
    matches goes out cut by cut in the cuts' order (random slot order within a cut),
    each datagram with IP_TOS ``tos_of(cut.level)``; the receiver gets a Message whose
    ``parts`` time each cut. Control frames carry ``control_tos``. Left empty, nothing
    is tagged."""

    def __init__(self, transport: DatagramTransport, channel: control.Channel, peer_id: int,
                 udp_addr: tuple[str, int], send_id: int | None = None) -> None:
        self.transport = transport
        self.channel = channel
        self.peer = channel.peer
        # Message ids carry a connection id in their top 16 bits, each side's own: the
        # peer's messages carry ``peer_id`` (given by this side, unique among its
        # connections), this side's carry ``send_id`` (given by the peer). One id both
        # ways collided at a worker connected to two PS shards (both gave it id 1).
        self.peer_id = peer_id
        self.send_id = peer_id if send_id is None else send_id
        self.udp_addr = udp_addr
        # SimpleQueues: a fraction of a Queue's cost, paid per message on every side.
        self.inbox: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        # Or, once a role's Inbox is attached (attach), what is received goes to it.
        self._sink: Sink | None = None
        self._sink_lock = threading.Lock()
        self.tx: dict[int, _Tx] = {}
        self.cuts: dict[Kind, tuple[base.Cut, ...]] = {}
        self.tos_of: Callable[[int], int] | None = None
        self._control_tos = 0
        self._counter = 0
        self._closed = False
        # Data goes out from a thread of its own, so that send returns once a message
        # is handed over (as a TCP send returns once the kernel has it) and the PS's
        # replies to several workers are under way at once (srpt.py orders them).
        self._outgoing: queue.SimpleQueue[_Outgoing | None] = queue.SimpleQueue()
        self._send_error: base.TransportError | None = None
        self.start_grant_bit: float | None = None  # where the next message's rate starts
        self.outage = sender.Outage()   # its sends refused as the path is down (send thread)
        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                        name=f"ctrl-{peer_id}")
        self._reader.start()
        self._sender = threading.Thread(target=self._send_loop, daemon=True,
                                        name=f"send-{peer_id}")
        self._sender.start()

    @property
    def control_tos(self) -> int:
        return self._control_tos

    @control_tos.setter
    def control_tos(self, tos: int) -> None:
        """Tag the control channel (BEGIN, HELLO, PULL, ...; DONE and NACK from this
        side). END frames of a tagged message go in its data's class instead."""
        self.channel.default_tos = tos
        self._control_tos = tos

    def layout_for(self, msg: Message, stride: int) -> cutlayout.Layout | None:
        """The wire layout to send ``msg`` in, or None to send it whole and untagged."""
        cuts = self.cuts.get(msg.kind)
        if not cuts or msg.mask is not None or msg.values.size != sum(c.size for c in cuts):
            return None
        return cutlayout.plan(cuts, msg.values.size, stride)

    def _next_id(self) -> int:
        self._counter = (self._counter + 1) & 0xFFFF
        return (self.send_id << 16) | self._counter

    def send(self, msg: Message, timeout_s: float | None = None) -> None:
        """Send ``msg``: a message without a vector at once on the control channel; a
        vector's BEGIN at once, its packets by the connection's sender thread, in the
        order sent. A failure of an earlier message's sending is raised here (and by
        recv)."""
        if self._closed:
            raise base.PeerClosed(f"connection to {self.peer} is closed")
        if self._send_error is not None:
            raise self._send_error
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
        return _taken(item)

    def attach(self, sink: Sink) -> None:
        """Hand what this connection receives to ``sink`` as it comes in, in place of
        ``recv``: ``sink(msg, None)`` per message, ``sink(None, err)`` for a failure. A
        role's Inbox then needs no reader thread per connection, and each message is
        handed over once less (a thread's wake-up and the GIL). What is waiting goes
        first. Once ``sink`` returns False (it took a STOP) or has had a failure,
        later messages wait for ``recv`` again, and a failure stays for every ``recv``,
        as ``recv`` leaves it."""
        with self._sink_lock:
            while True:
                try:
                    item = self.inbox.get_nowait()
                except queue.Empty:
                    break
                if not self._give(sink, item):
                    return
            self._sink = sink

    def _deliver(self, item: _Item) -> None:
        """A message received, or the connection's failure: to the attached sink, or to
        ``recv``."""
        with self._sink_lock:
            if self._sink is None:
                self.inbox.put(item)
                return
            try:
                more = self._give(self._sink, item)
            except Exception:  # a role's sink must not end the receive or control thread
                log.exception("the receiver of %s's messages failed", self.peer)
                more = False
            if not more:
                self._sink = None

    def _give(self, sink: Sink, item: _Item) -> bool:
        """``item`` to ``sink``; whether it takes more."""
        if isinstance(item, BaseException):
            sink(None, item)
            self.inbox.put(item)  # for every later recv
            return False
        return sink(_taken(item), None)

    def close(self) -> None:
        if self._closed:
            return
        if not self.transport.bounded and self._sender is not threading.current_thread():
            # udp: what send() handed over goes out first (a pass needs no answer), so a
            # role's last message is not cut by its own close. (Bounded loss would wait
            # for DONE, from a peer that may be gone: its close cuts at once.)
            self._outgoing.put(None)
            self._sender.join(timeout=UDP_LINGER_S)
        self._closed = True
        self._outgoing.put(None)
        for tx in list(self.tx.values()):
            tx.done.set()  # stops pacing at the next burst
        self.transport._schedule.changed()  # and a pass waiting for its turn at once
        self.channel.close()
        self.transport._forget_conn(self)
        if self._sender is not threading.current_thread():
            self._sender.join(timeout=2.0)

    def _send_loop(self) -> None:
        while True:
            out = self._outgoing.get()
            if out is None or self._closed:
                return
            try:
                self.transport._transmit(self, out)
            except base.TransportError as err:
                self._failed(err)
                return
            except Exception as err:  # our bug: make it visible to the role
                log.exception("sender for %s failed", self.peer)
                self._failed(base.TransportError(f"{self.peer}: sender failed: {err!r}"))
                return

    def _failed(self, err: base.TransportError) -> None:
        """A message could not be sent: the next send and recv raise ``err``."""
        if self._closed:
            return
        self._send_error = err
        self._deliver(err)

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
        self._deliver(err)
        for tx in list(self.tx.values()):
            tx.frames.put(err)


class DatagramTransport(base.Transport):
    """Range-indexed UDP data plus a TCP control channel; see the module docstring."""

    name = "udp"
    bounded = False

    def __init__(self, job: str = "tailcut", mtu: int = wire.DEFAULT_MTU,
                 rate_bit: float | None = None, end_grace_ms: float = 2.0,
                 max_elements: int = wire.DEFAULT_MAX_ELEMENTS, seed: int | None = None,
                 gso: bool = False, link_bit: float | None = None,
                 switch_buffer_bytes: int | None = None) -> None:
        super().__init__()
        if rate_bit is not None and not (isinstance(rate_bit, (int, float)) and rate_bit > 0):
            raise ValueError(f"rate_bit={rate_bit!r}: must be > 0 (bits per second), or "
                             "unset for the link's rate")
        if not 0 <= end_grace_ms <= 10_000:
            raise ValueError(f"end_grace_ms={end_grace_ms}: must be in [0, 10000]")
        self.job = job
        self.job_id = wire.job_id(job)
        self.stride = wire.elements_per_packet(mtu)
        self.rate_bit = rate_bit
        if link_bit is not None and not (isinstance(link_bit, (int, float)) and link_bit > 0):
            raise ValueError(f"link_bit={link_bit!r}: must be > 0 (bits per second), or unset "
                             "to read the rate of the interface's HTB class")
        # The rate of this pod's own link, as the plan shaped it; unset: read from the
        # interface's HTB class (netlink, pyroute2: ~0.3 s of a role's start).
        self.link_bit = link_bit
        self.end_grace_s = end_grace_ms / 1e3
        self.max_elements = max_elements
        # UDP GSO (batch.py): every path acts per packet after the kernel's cut
        # (tailcut.plan.transport_options); off for a test's own links.
        self.gso = bool(gso)
        # A path with no finite switch buffer: a burst then waits in the sender's own
        # link shaper, whatever its size, so it may be a whole GSO message
        # (sender.burst_floor). Random loss acts per datagram whatever the burst.
        self.burst_packets = sender.burst_floor(self.gso and switch_buffer_bytes is None, mtu)
        # The smallest switch buffer on the path (None: deep): a pass's start credit,
        # which the pod's shaper lets out at once, stays within half of it.
        if switch_buffer_bytes is not None and not (
                isinstance(switch_buffer_bytes, int) and switch_buffer_bytes > 0):
            raise ValueError(f"switch_buffer_bytes={switch_buffer_bytes!r}: must be a "
                             "positive number of bytes, or unset for deep buffers")
        self.credit_bytes = None if switch_buffer_bytes is None else switch_buffer_bytes / 2
        self.p = 1.0
        self._rng = np.random.default_rng(seed)
        self.stats: collections.Counter[str] = collections.Counter()
        # Every receive-side decision is the Receiver's, under this lock (taken by the
        # receive thread and by the control readers' BEGIN/END).
        self._lock = threading.Lock()
        self._recv = receiver.Receiver(self.job_id, self.stride, self.p, self.bounded,
                                       False, max_elements, self.stats)
        self._udp: socket.socket | None = None
        # With the XDP counter: whether the receive loop also reads every COALESCE_MS
        # while a message comes in (set by _start).
        self._coalesce_reads = True
        self._conn_ids = 0  # the last connection id given (_new_conn_id)
        self._threads: list[threading.Thread] = []
        self._running = False
        self._pace_bit: float | None = None  # this sender's link (or the spec's rate)
        self._link_bit: float | None = None  # this pod's link (HTB), both directions
        self._other_bit = 0.0  # the other traffic arriving on our link (LinkMonitor)
        self._monitor: congestion.LinkMonitor | None = None
        # The passes being paced at once: they share _pace_bit, shortest first (srpt.py).
        self._schedule = srpt.LinkSchedule(None)
        self._stats_lock = threading.Lock()  # (several connections' sender threads count)
        self.counter: Any = None  # tailcut.datapath.partial.Counter when XDP is on
        self.ring: Any = None  # tailcut.datapath.rxring.Ring: the kernel receive path
        self._ring_taken = 0   # datagrams it took, as last counted as ours
        # Wakes the receive thread from its sleep: an END was read, or close().
        self._wake: int | None = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._wake_lock = threading.Lock()
        self._stale_at: float | None = None  # when finished messages' entries are freed
        self.completions: collections.deque[dict[str, Any]] = collections.deque(maxlen=100_000)

    # ---- setup ----------------------------------------------------------------------

    @property
    def message_limit(self) -> int:
        """The most values one message may hold."""
        return min(self.max_elements, MAX_SLOTS * self.stride)

    def listen(self, host: str, port: int, count: int, timeout_s: float) -> list[base.Connection]:
        if self._udp is not None:
            # Peers that connect here send their datagrams to host:port, so listen owns
            # the one UDP socket (and XDP counter) that later connections share.
            raise base.TransportError(f"listen on {host}:{port} after a connect: a datagram "
                                      "transport must listen first, then connect")
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
                except base.PeerClosed:
                    # A connect attempt that gave up as the kernel completed its
                    # handshake (a lost SYN): the peer connects again
                    # (base.connect_tcp, CONNECT_ATTEMPT_S).
                    log.info("%s closed its connection before SETUP; waiting for the "
                             "next peer", channel.peer)
                    channel.close()
                    continue
                if hello.type != FrameType.SETUP or not 1 <= hello.count <= 65535 \
                        or not 0 <= hello.message <= 0xFFFF:
                    channel.close()
                    raise base.ProtocolError(
                        f"{channel.peer}: expected SETUP with a UDP port and a connection id "
                        f"(0-65535), got {hello.type.name} count={hello.count} "
                        f"message={hello.message}")
                peer_id = self._new_conn_id()
                channel.send(Frame(FrameType.SETUP, message=peer_id))
                sock.settimeout(None)
                # hello.message: the id the peer wants on our messages (0: an older
                # peer, which takes ours both ways)
                conns.append(self._add_conn(channel, peer_id, (addr[0], hello.count),
                                            hello.message or peer_id))
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
        sock = base.connect_tcp(host, port, timeout_s, retry_any_error=True)
        local_ip = sock.getsockname()[0]
        try:
            if self._udp is None:   # the first connection (a worker may have several)
                self._open_udp(local_ip, 0)
                self._start(local_ip)
            assert self._udp is not None
            channel = control.Channel(sock, f"{host}:{port}")
            sock.settimeout(max(base.remaining(deadline) or 0.0, 1e-6))
            local_id = self._new_conn_id()
            channel.send(Frame(FrameType.SETUP, message=local_id,
                               count=self._udp.getsockname()[1]))
            try:
                reply = channel.read()
            except TimeoutError:
                raise base.TransportTimeout(f"{host}:{port} did not answer SETUP in time") \
                    from None
            if reply.type != FrameType.SETUP or not 1 <= reply.message <= 0xFFFF:
                raise base.ProtocolError(f"{host}:{port}: expected SETUP with a peer id, got "
                                         f"{reply.type.name} message={reply.message}")
            sock.settimeout(None)
            # The PS's datagrams come from its address, whatever name reached it (on
            # Kubernetes, ps-0.<job> through the job's headless service).
            return self._add_conn(channel, local_id, (sock.getpeername()[0], port),
                                  reply.message)
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
        granted = udp.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        if granted < DEEP_SOCKET_BYTES:
            # Without CAP_NET_ADMIN (a udp pod on Kubernetes runs unprivileged) the
            # buffer stops at net.core.rmem_max: say so, or its drops pass for the link's.
            log.warning("UDP %s:%d: the kernel granted a %d-byte receive buffer (SO_RCVBUF, "
                        "capped by net.core.rmem_max without CAP_NET_ADMIN), under the %d "
                        "the transport needs: messages arriving at once can overflow it "
                        "and count as lost though the link lost nothing. Raise "
                        "net.core.rmem_max to %d on the host or node (sysctl -w), or run "
                        "the role with CAP_NET_ADMIN.", host, udp.getsockname()[1], granted,
                        DEEP_SOCKET_BYTES, SOCKET_BUFFER_BYTES)
        # Kernel receive timestamps tell the receive loop how far it has read (see
        # receiver.Receiver.sweep).
        udp.setsockopt(socket.SOL_SOCKET, batch.SO_TIMESTAMPNS, 1)
        udp.settimeout(0.002)
        self._udp = udp

    def _start(self, local_ip: str) -> None:
        """Attach the XDP counter (bounded-loss) and start the receive threads."""
        assert self._udp is not None
        self._link_bit = (self.link_bit if self.link_bit is not None
                          else _link_rate_bit(local_ip))
        self._pace_bit = self.rate_bit if self.rate_bit is not None else self._link_bit
        # The link monitor's samples read the socket too: between them it must hold
        # what arrives, four times over, at ~2x the payload in kernel memory (a faster
        # link than 1 Gbit/s needs more than DEEP_SOCKET_BYTES). An unshaped link has
        # no samples; early close watches each pass's last packet.
        rcvbuf = self._udp.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        self._coalesce_reads = self._link_bit is None or self._recv.early_close or \
            rcvbuf < max(DEEP_SOCKET_BYTES, 2 * 4 * congestion.SAMPLE_S * self._link_bit / 8)
        self._schedule = srpt.LinkSchedule(self._pace_bit)
        if self._link_bit is not None:
            self._monitor = congestion.LinkMonitor(_ifname_of(local_ip))
        self._attach(local_ip, self._udp.getsockname()[1])
        self._recv.xdp = self.counter is not None
        self._running = True
        self._threads.append(threading.Thread(target=self._udp_loop, daemon=True,
                                              name="udp-rx"))
        for t in self._threads:
            t.start()

    def _attach(self, local_ip: str, port: int) -> None:
        """The udp transport counts nothing in XDP; bounded-loss overrides this."""

    def _new_conn_id(self) -> int:
        """An id for a new connection, unique among this transport's (1..0xFFFF)."""
        with self._lock:
            self._conn_ids += 1
            if self._conn_ids > 0xFFFF:
                raise base.TransportError("more than 65535 connections on one transport")
            return self._conn_ids

    def _add_conn(self, channel: control.Channel, peer_id: int,
                  udp_addr: tuple[str, int], send_id: int | None = None) -> DatagramConnection:
        conn = DatagramConnection(self, channel, peer_id, udp_addr, send_id)
        with self._lock:
            self._recv.peers[peer_id] = (conn, batch.ipv4(udp_addr[0]))
        return conn

    def _forget_conn(self, conn: DatagramConnection) -> None:
        with self._lock:
            if self._recv.peers.get(conn.peer_id, (None,))[0] is conn:
                del self._recv.peers[conn.peer_id]
                self._recv.forget_peer(conn.peer_id)

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
        self._wake_loop()
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
        if self.ring is not None:
            with self._lock:   # (no message is bound once the receiver lets go)
                self._recv.ring = None
                self.ring.detach()
            self.ring = None
        if self._monitor is not None:
            self._monitor.close()
        with self._wake_lock:
            if self._wake is not None:
                os.close(self._wake)
                self._wake = None

    def _wake_loop(self) -> None:
        with self._wake_lock:
            if self._wake is not None:
                os.eventfd_write(self._wake, 1)

    # ---- sending --------------------------------------------------------------------

    def _send_data(self, conn: DatagramConnection, msg: Message, sent_at: int,
                   deadline: float | None) -> None:
        """Check and lay out ``msg``, send its BEGIN, hand its packets to the
        connection's sender thread (``_transmit``)."""
        # A copy: the caller may change its array once send returns.
        values = np.array(msg.values, dtype=wire.VALUE_DTYPE).reshape(-1)
        layout = conn.layout_for(msg, self.stride)
        if layout is not None:
            values = layout.to_wire(values)
        total = values.size
        n_slots = wire.slots(total, self.stride)
        if total > self.max_elements or n_slots > MAX_SLOTS:
            raise ValueError(f"message of {total} values: at most {self.message_limit} "
                             f"({MAX_SLOTS} packets of {self.stride})")
        mid = conn._next_id()
        tx = conn.tx[mid] = _Tx(grant_bit=conn.start_grant_bit)
        try:
            # BEGIN first, so that the receiver sets up while the packets are made; from
            # the caller's thread, so that it stays in order with the control frames
            # the caller sends next (a worker's PULL follows its PUSH).
            conn.channel.send(Frame(FrameType.BEGIN, int(msg.kind), mid, msg.iteration,
                                    msg.sender, total, sent_at,
                                    layout.encode() if layout is not None else b"",
                                    _start_mbit(tx.grant_bit)))
        except BaseException:
            del conn.tx[mid]
            raise
        tos = None
        if layout is None:
            order = self._rng.permutation(n_slots)
        else:
            # Cut after cut, in send order; random within a cut, so that what is
            # lost or left out at p is spread over each tensor.
            order = np.concatenate([lo + self._rng.permutation(hi - lo) for lo, hi in
                                    zip(layout.first_slot[:-1], layout.first_slot[1:])])
            tos_of = conn.tos_of or (lambda level: 0)
            cut_tos = np.array([0 if c.level is None else tos_of(c.level)
                                for c in layout.cuts], np.int64)
            tos = cut_tos[layout.slot_cut]
        conn._outgoing.put(_Outgoing(mid, values, int(msg.kind), order, tos, layout, tx,
                                     deadline))

    def _transmit(self, conn: DatagramConnection, out: _Outgoing) -> None:
        """Send one message's packets (the connection's sender thread): a pass, END,
        then (bounded-loss) retransmit what each NACK lists until DONE."""
        mid, order, tos, layout, tx, deadline = (
            out.message, out.order, out.tos, out.layout, out.tx, out.deadline)
        packets = sender.Packets(out.values, self.job_id, mid, out.kind, self.stride)
        n_slots = len(packets)
        try:
            slot_levels = None if layout is None else np.array(
                [c.level or 0 for c in layout.cuts], np.int64)[layout.slot_cut]
            idle_at = self._pace(conn, packets, order, 0, 0, tx, deadline, tos, slot_levels,
                                 settle=False)
            seq = len(order)
            # A message that reaches p near the end of its pass (a small one: p = 0.9
            # of 180 packets leaves 18 to send) is DONE soon after: then no END. The
            # wait starts when the link has carried the pass (its last burst is not slept
            # off first: one wake-up, the DONE's, where there were two).
            wait_s = END_WAIT_S if self.bounded else 0.0
            if idle_at is not None:
                wait_s += max(0.0, idle_at - time.monotonic())
            if tx.done.is_set() or (wait_s > 0 and tx.done.wait(wait_s)):
                return
            self._end(conn, mid, order, tos)
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
                if frame.type != FrameType.NACK:
                    continue
                missing = np.unique(np.frombuffer(frame.extra, dtype=">u4").astype(np.int64))
                missing = missing[missing < n_slots]
                self._rng.shuffle(missing)
                if layout is not None:  # still the most urgent cut first
                    missing = missing[np.argsort(layout.slot_cut[missing], kind="stable")]
                with self._stats_lock:
                    self.stats["retransmitted"] += len(missing)
                self._pace(conn, packets, missing, seq, wire.F_RETX, tx, deadline, tos,
                           slot_levels)
                seq += len(missing)
                if tx.done.is_set():
                    return
                self._end(conn, mid, missing, tos)
        finally:
            del conn.tx[mid]
            if tx.lowest_grant_bit is not None:
                conn.start_grant_bit = tx.lowest_grant_bit

    @staticmethod
    def _end(conn: DatagramConnection, mid: int, order: np.ndarray,
             tos: np.ndarray | None) -> None:
        """END the pass over slots ``order``. The receiver takes a pass as drained once
        it has read the socket up to END's arrival, which assumes END travelled behind
        the pass's packets. Under priority classes one control-class END overtakes the
        queued less urgent data (measured: 10x the NACKs and retransmissions), and no
        single class is safe either (HTB serves a class under its own rate before the
        busy, borrowing ones), so a tagged pass sends one END per class it used, each
        behind that class's packets, and the receiver waits for all of them."""
        if tos is None or not len(order):
            # Untagged data is in the default class: so is its END, even on a
            # connection whose control frames are tagged.
            conn.channel.send(Frame(FrameType.END, message=mid, count=len(order)), 0)
            return
        used = _in_order(tos[order])
        for t in used:
            conn.channel.send(Frame(FrameType.END, message=mid, iteration=len(used),
                                    count=len(order)), int(t))

    def _pace(self, conn: DatagramConnection, packets: sender.Packets, order: np.ndarray,
              seq: int, flags: int, tx: _Tx, deadline: float | None,
              tos: np.ndarray | None = None, slot_levels: np.ndarray | None = None,
              settle: bool = True) -> float | None:
        """Number slots ``order`` from ``seq`` and send them paced (``tos``, and the
        priority levels that order passes on the link, ``slot_levels``: per slot); stop
        early at DONE. Without ``settle``, returns when the link will have carried the
        pass (sender.pace's idle_at) instead of sleeping until then."""
        udp = self._udp
        assert udp is not None
        packets.number(order, seq, flags)
        # sendmmsg sends a burst per system call; a socket wrapped by a test (to drop
        # datagrams) or a libc without it takes the per-datagram path.
        direct = batch.available() and isinstance(udp, socket.socket)
        outage = conn.outage
        was_down = outage.since is not None
        levels = None if slot_levels is None else slot_levels[order].tolist()
        turn = self._schedule.enter(sender.wire_bytes(packets, order),
                                    lambda: tx.grant_bit, levels)
        outcome = sender.Pass()
        try:
            outcome = sender.pace(udp, conn.udp_addr, packets, order, None, tx.done,
                                  deadline, conn.peer, None if direct else udp.sendto, tos,
                                  self.gso, self.burst_packets, outage, turn,
                                  self.credit_bytes, settle)
        finally:
            self._schedule.leave(turn)
            with self._stats_lock:
                self.stats["packets_sent"] += outcome.sent
                if outcome.unsent:
                    self.stats["unsent"] += outcome.unsent
        if outcome.unsent and not was_down:   # an outage began during this pass
            log.warning("sending to %s: %s; what is refused counts as lost (transport "
                        "stats: unsent) for up to %.0f s", conn.peer, outage.why,
                        sender.PATH_DOWN_GRACE_S)
        if outage.since is None and (was_down or outcome.unsent):
            log.warning("sending to %s: the path is back; %d datagrams were refused",
                        conn.peer, outage.unsent)
        return outcome.idle_at

    # ---- receiving ------------------------------------------------------------------

    def _on_frame(self, conn: DatagramConnection, frame: Frame) -> None:
        """Called by a connection's control reader thread."""
        if frame.type == FrameType.MSG:
            if frame.kind not in _KINDS:
                raise base.ProtocolError(f"{conn.peer}: MSG of unknown kind {frame.kind}")
            msg = Message(Kind(frame.kind), frame.iteration, frame.sender,
                          sent_at_ns=frame.sent_at_ns, received_at_ns=time.time_ns(),
                          wire_bytes=control.HEADER.size)
            conn._deliver((msg, None))
        elif frame.type == FrameType.BEGIN:
            self._begin(conn, frame)
        elif frame.type == FrameType.END:
            with self._lock:
                self._recv.end(conn, frame.message, frame.iteration)
            self._wake_loop()  # it may sleep; the pass is to be judged end_grace_ms on
        elif frame.type in (FrameType.DONE, FrameType.NACK):
            tx = conn.tx.get(frame.message)
            if tx is not None:
                if frame.type == FrameType.DONE:
                    tx.done.set()
                    self._schedule.changed()  # a pass waiting for its turn stops now
                tx.frames.put(frame)
        elif frame.type == FrameType.GRANT:
            tx = conn.tx.get(frame.message)
            if tx is not None:  # a grant for a message already done is moot
                tx.grant(max(congestion.MIN_RATE_BIT, frame.count * 1e3))
                self._schedule.changed()  # what this grant leaves may be another's turn
        else:
            raise base.ProtocolError(f"{conn.peer}: unexpected {frame.type.name} frame")

    def _begin(self, conn: DatagramConnection, f: Frame) -> None:
        if f.kind not in wire.DATA_KINDS:
            raise base.ProtocolError(f"{conn.peer}: BEGIN of kind {f.kind}; data is PUSH/PARAMS")
        if not 1 <= f.count <= self.max_elements or wire.slots(f.count, self.stride) > MAX_SLOTS:
            raise base.ProtocolError(f"{conn.peer}: BEGIN total {f.count} elements is out of "
                                     f"range 1..{self.message_limit}")
        if f.message >> 16 != conn.peer_id:
            raise base.ProtocolError(f"{conn.peer}: message id {f.message:#x} is not of peer "
                                     f"{conn.peer_id}")
        layout = None
        if f.extra:
            try:
                layout = cutlayout.decode(f.extra, f.count, self.stride)
            except ValueError as err:
                raise base.ProtocolError(f"{conn.peer}: BEGIN of message {f.message:#x}: "
                                         f"{err}") from None
        with self._lock:
            if f.message in self._recv.rx:
                raise base.ProtocolError(f"{conn.peer}: BEGIN of message {f.message:#x} twice")
            done = self._recv.begin(conn, batch.ipv4(conn.udp_addr[0]), f.message, f.kind,
                                    f.iteration, f.sender, f.count, f.sent_at_ns, layout,
                                    start_kbit=f.rate_mbit * 1000)
            rx = self._recv.rx.get(f.message)
            placed = rx is not None and rx.bound_ahead
        self._finish(done)
        self._regrant()
        # With XDP on, the receive thread reads only once told. A message the kernel
        # path placed from its first datagram needs no reading: its event says when it
        # is in; one bound only now may have datagrams in the socket already.
        if not placed:
            self._wake_loop()

    def _resample(self, monitor: congestion.LinkMonitor, now: float) -> None:
        """Re-read the other traffic on our link; grant anew if it moved by more than
        congestion.POOL_STEP of the link."""
        other = monitor.sample(now)
        if other is None or self._link_bit is None:
            return
        step = congestion.POOL_STEP * self._link_bit
        if abs(other - self._other_bit) > step or (other < step) != (self._other_bit < step):
            self._other_bit = other
            self._regrant()

    def _regrant(self) -> None:
        """Grant every message converging on this receiver its share of the link (after
        a BEGIN, or once a message is finished)."""
        with self._lock:
            active = list(self._recv.rx.values())
            pool = congestion.pool(self._link_bit, self._other_bit, len(active))
            grants = congestion.shares(pool, active)
        with self._stats_lock:
            self.stats["grants"] += len(grants)
        for rx, kbit in grants:
            try:
                rx.conn.channel.send(Frame(FrameType.GRANT, message=rx.message, count=kbit))
            except base.TransportError:
                pass  # the peer is gone; its reader thread reports it to recv()

    def _udp_loop(self) -> None:
        """The receive thread: read the socket a batch at a time, then the XDP events;
        in between, sleep until there is something to read or to do.

        With the XDP counter, datagrams do not wake the thread: a BEGIN does (from the
        control reader), the event of a message crossing p does, and END; while
        messages are coming in it also reads at every sample of the link's counter
        (congestion.SAMPLE_S), and every COALESCE_MS where those are not enough
        (_coalesce_reads: early close, an unshaped link, a shallow socket). Whatever arrives with
        no message coming in (packets still in flight after a DONE) is read when the
        finished messages' XDP entries are freed, STALE_DELAY_S on, off any message's
        path. Without it (udp, or XDP off), a datagram wakes it, and a short batch is
        followed by COALESCE_S of sleep."""
        _ReceiveLoop(self).run()

    def _free_stale(self) -> None:
        """Free the XDP entries of finished messages (packets still in flight after DONE,
        the sender stops a little late, re-create them), off a completion's path."""
        if self.counter is None:
            return
        with self._lock:
            stale = [m for m in self.counter.messages() if m in self._recv.finished]
        for m in stale:
            self.counter.forget(m, self.job_id)

    def _finish(self, done: list[receiver.Done]) -> None:
        """Deliver completed messages and send DONE/NACK, outside the lock; the
        messages still coming in then share what the finished ones leave."""
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
            if self.counter is not None and self._stale_at is None:
                # Its XDP entry: freed by the receive thread, STALE_DELAY_S after the
                # first completion not yet freed. Not pushed back by each completion:
                # back to back (the PS's pushes, a ping-pong) the freeing never came,
                # and the counter's table filled up (then no message fired).
                self._stale_at = time.monotonic() + STALE_DELAY_S
            full = rx.count == rx.elements
            record = {"message": rx.message, "reason": reason, "total": rx.elements,
                      "delivered": rx.count, "event_ns": rx.event_ns,
                      "done_ns": time.monotonic_ns(), "begun_ns": rx.begun_ns}
            self.completions.append(record)
            now = time.time_ns()
            values, mask, parts = rx.values, rx.mask, None
            if rx.layout is not None:
                assert rx.cut_done_ns is not None
                values, mask = rx.layout.from_wire(rx.values, rx.mask)
                # A cut cut short (p reached, or udp's pass ended) is done when the
                # message is: that is when the application gets what it has of it.
                parts = [base.Part(c.offset, c.size, c.level, rx.sent_at_ns, int(t) or now)
                         for c, t in zip(rx.layout.cuts, rx.cut_done_ns.tolist())]
                record["cuts"] = [(c.offset, c.size, c.level, int(np.count_nonzero(
                    mask[c.offset:c.offset + c.size]))) for c in rx.layout.cuts]
            msg = Message(Kind(rx.kind), rx.iteration, rx.sender, values,
                          None if full else mask, rx.sent_at_ns, now, rx.wire_bytes, parts,
                          rx.repairs)
            rx.conn._deliver((msg, record))
        if any(d.reason != "nack" for d in done):
            self._regrant()


class _Taken(NamedTuple):
    """What the receive loop learnt from handing a batch to the receiver."""

    now: float            # monotonic, when it was handed over
    live: bool            # some message is coming in
    sweep_at: float | None  # when the receiver's next sweep is due
    hurry: bool           # a message fired short of its packets: read the socket now
    unplaced: bool        # a message coming in has no kernel region: its data is the socket's


class _ReceiveLoop:
    """The receive thread (DatagramTransport._udp_loop): its socket reader, its waits,
    and what it keeps from one batch to the next."""

    def __init__(self, transport: DatagramTransport) -> None:
        self.transport = transport
        udp, wake = transport._udp, transport._wake
        assert udp is not None and wake is not None
        self.wake = wake
        self.inbox = _inbox(udp, transport._recv.row_bytes, transport.counter)
        counter = transport.counter
        self.ring = counter.fileno() if counter is not None else None
        self.signals = select.poll()  # a wake-up (BEGIN, END, close) or an XDP event
        self.signals.register(wake, select.POLLIN)
        self.data = select.poll()  # the same, or a datagram
        self.data.register(wake, select.POLLIN)
        self.data.register(udp.fileno(), select.POLLIN)
        self.ring_ready = select.poll()
        if self.ring is not None:
            for poller in (self.signals, self.data, self.ring_ready):
                poller.register(self.ring, select.POLLIN)
        # The kernel receive path's events: a message at p, or complete.
        self.kernel = transport.ring
        self.kernel_ready = select.poll()
        if self.kernel is not None:
            for poller in (self.signals, self.data, self.kernel_ready):
                poller.register(self.kernel.fileno(), select.POLLIN)
        self.read_up_to_ns = 0  # kernel arrival time (CLOCK_REALTIME) of what has been read
        self.sampled = -math.inf  # when the link's counter was last read
        self.late_seen = 0  # late packets (of finished messages) read so far

    def run(self) -> None:
        t = self.transport
        while t._running:
            n = self._read()
            if n is None:
                break  # closed
            taken = self._take(n)
            # The other traffic on the link matters to the messages coming in: read it
            # every SAMPLE_S while there are some, now and then otherwise.
            every = congestion.SAMPLE_S if taken.live else IDLE_SAMPLE_S
            self._look_after(taken.now, every)
            if t._stale_at is not None and taken.now >= t._stale_at:
                t._stale_at = None
                t._free_stale()
                continue  # and read what came in meanwhile
            if self.inbox.filled:
                continue  # more is waiting
            if not self._wait(n, taken, every):
                break  # closed under a late thread

    def _read(self) -> int | None:
        """One batch from the socket (0: it was empty); None: the socket is closed."""
        inbox, t = self.inbox, self.transport
        asked_ns = time.time_ns()
        try:
            n = inbox.recv()
        except OSError:
            return None
        if not n:
            # The socket was empty: everything that arrived before we asked is read.
            self.read_up_to_ns = asked_ns
            return 0
        self.read_up_to_ns = inbox.arrival_ns(n - 1) or self.read_up_to_ns
        if isinstance(inbox, batch.GroInbox):
            t.stats["gso_messages_read"] = inbox.gso_messages
            t.stats["gso_misfits"] = inbox.misfits
        if t._monitor is not None:
            t._monitor.ours(int(inbox.lengths(n).sum()), inbox.packets)
        return n

    def _take(self, n: int) -> _Taken:
        """Hand the batch and the XDP events to the receiver; deliver what completed."""
        t, inbox = self.transport, self.inbox
        # After the batch: an event is in the ring before its packet is in the socket.
        events = t.counter.consume() if self.ring is not None and self.ring_ready.poll(0) \
            else []
        done: list[receiver.Done] = []
        now = time.monotonic()
        with t._lock:
            if n:
                t._recv.accept(inbox.rows(n), inbox.lengths(n), inbox.sources(n), done,
                               inbox.arrivals(n) if t._recv.early_close else None,
                               inbox.addresses)
            for ev in events:
                if ev.job == t.job_id:
                    t._recv.fired(ev.message, ev.ktime_ns, done)
            if self.kernel is not None and self.kernel_ready.poll(0):
                for kev in self.kernel.consume():
                    t._recv.kernel_event(kev.message, kev.ktime_ns, kev.at_p, done)
            t._recv.sweep(now, self.read_up_to_ns, t.end_grace_s, done)
            taken = _Taken(now, bool(t._recv.rx), t._recv.next_sweep(t.end_grace_s),
                           t._recv.fired_short(), self.kernel is not None
                           and any(rx.kernel is None for rx in t._recv.rx.values()))
        t._finish(done)
        return taken

    def _look_after(self, now: float, every: float) -> None:
        """Between batches: the link's other traffic, and late packets' XDP entries (or
        the kernel path's regions of messages handed over)."""
        t = self.transport
        if self.kernel is not None:
            with t._lock:
                t._recv.release_regions(now)
        late = t._recv.stats["late"]
        if late != self.late_seen and t.counter is not None and t._stale_at is None:
            # Late packets re-create their finished message's XDP entry: free it again,
            # or the last message's entry stays until another message completes.
            t._stale_at = now + STALE_DELAY_S
        self.late_seen = late
        # Once the socket is drained, or our unread datagrams would count as other
        # traffic (unless the reads never catch up: then every 4 samples' time).
        monitor = t._monitor
        if monitor is not None and now >= self.sampled + every and (
                not self.inbox.filled or now >= self.sampled + 4 * every):
            if self.kernel is not None:   # ours too, though no socket read them
                taken = self.kernel.taken()
                new, t._ring_taken = taken - t._ring_taken, taken
                monitor.ours(new * t._recv.row_bytes, new)
            t._resample(monitor, now)
            self.sampled = now

    def _wait(self, n: int, taken: _Taken, every: float) -> bool:
        """Sleep until something is due or arrives; False: the transport was closed."""
        t, now = self.transport, taken.now
        due = [d for d in (taken.sweep_at, t._stale_at, t._recv.next_release())
               if d is not None]
        if t._monitor is not None:
            due.append(self.sampled + every)
        if self.ring is None and self.kernel is None:
            if n and taken.live and n < COALESCE_PACKETS:
                # Packets are flowing but the loop has caught up: let a few more
                # arrive rather than pay the per-batch cost on every one or two.
                time.sleep(COALESCE_S)
                return True
        elif taken.live and not taken.hurry and t._coalesce_reads and (
                self.kernel is None or taken.unplaced):
            due.append(now + COALESCE_MS / 1e3)  # read what gathered meanwhile
        wait_s = min([IDLE_WAIT_S] + [d - now for d in due])
        # An event whose packet is not read yet: wait for the socket, not a timer. The
        # kernel path's events need no socket, unless a message has no region.
        if self.kernel is not None:
            waiter = self.data if taken.unplaced else self.signals
        else:
            waiter = self.data if self.ring is None or taken.hurry else self.signals
        # In whole ms (poll's unit), rounded up, but not for the float error of
        # "now + 1 ms - now", which would make every COALESCE_MS wait 2 ms.
        waiter.poll(max(0, math.ceil(wait_s * 1e3 - 1e-3)))
        try:
            os.eventfd_read(self.wake)
        except BlockingIOError:
            pass  # nobody woke us
        except OSError:
            return False
        return True


def _inbox(udp: socket.socket, row_bytes: int, counter: Any) -> batch.Inbox | batch.GroInbox:
    """The receive thread's reader of ``udp``: whole UDP GSO messages where they can
    reach it whole."""
    if counter is not None and counter.mode == "native":
        # Not with native XDP: the veth then does GRO itself and would merge one
        # sender's single datagrams into messages cut at other sizes (misfits); and the
        # port cuts GSO messages for it anyway (the veth's peer loses its GSO features
        # when native XDP is attached).
        return batch.Inbox(udp, RECV_BATCH, row_bytes)
    try:
        return batch.GroInbox(udp, RECV_BATCH, row_bytes)
    except OSError:  # a kernel without UDP_GRO cuts them before the socket
        return batch.Inbox(udp, RECV_BATCH, row_bytes)


class BoundedLossTransport(DatagramTransport):
    """At least a fraction p of every message, fast; the rest is ignored."""

    name = "bounded-loss"
    bounded = True

    def __init__(self, p: float = 0.9, job: str = "tailcut", mtu: int = wire.DEFAULT_MTU,
                 rate_bit: float | None = None, xdp: bool = True,
                 xdp_mode: str = "generic", end_grace_ms: float = 2.0,
                 max_elements: int = wire.DEFAULT_MAX_ELEMENTS, seed: int | None = None,
                 min_p: float | None = None, gso: bool = False,
                 link_bit: float | None = None,
                 switch_buffer_bytes: int | None = None,
                 receive_path: str = "socket") -> None:
        """``min_p`` (early close, docs/bounded-loss.md): a message whose pass is over
        and whose packets have stopped coming is handed over below p with what
        arrived, if at least min_p; None (the default) or min_p = p: p is the floor.
        ``receive_path``: "socket" (the XDP counter, if ``xdp``, counts; the receive
        thread reads every datagram) or "kernel" (a tc program at the interface's
        ingress places each datagram in a mapped buffer and wakes the thread at p:
        tailcut.datapath.rxring; no XDP counter)."""
        # (checked before the base class opens anything)
        p = fraction.check(p, what="0.9 = deliver at least 90% of every message")
        if min_p is not None:
            min_p = fraction.check(min_p, "min_p", most=p, what="the floor a message whose "
                                   "packets stopped coming may be handed over at")
        if xdp_mode not in ("generic", "native"):
            raise ValueError(f"xdp_mode={xdp_mode!r}: must be generic or native")
        if receive_path not in RECEIVE_PATHS:
            raise ValueError(f"receive_path={receive_path!r}: must be one of "
                             f"{', '.join(RECEIVE_PATHS)}")
        super().__init__(job=job, mtu=mtu, rate_bit=rate_bit, end_grace_ms=end_grace_ms,
                         max_elements=max_elements, seed=seed, gso=gso, link_bit=link_bit,
                         switch_buffer_bytes=switch_buffer_bytes)
        self._recv.min_p = min_p
        self.p = self._recv.p = p
        self.xdp = xdp
        self.xdp_mode = xdp_mode
        self.receive_path = receive_path

    def _attach(self, local_ip: str, port: int) -> None:
        if self.receive_path == "kernel":
            self._attach_ring(local_ip, port)
            return
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


    def _attach_ring(self, local_ip: str, port: int) -> None:
        from tailcut.datapath import clsact, rxring
        from tailcut.errors import DatapathError
        try:
            self.ring = rxring.attach(clsact.HERE, _ifname_of(local_ip), port=port,
                                      job=self.job_id, stride=self.stride,
                                      ranges=KERNEL_RANGES, regions=KERNEL_REGIONS)
        except DatapathError as err:
            raise base.TransportError(f"bounded-loss receiver on {local_ip}:{port}: {err}") \
                from err
        self._recv.ring = self.ring
        print(f"tailcut bounded-loss: kernel receive path on {self.ring.ifname} ingress "
              f"(prog id {self.ring.prog_id}, p={self.p}, {KERNEL_REGIONS} messages of up "
              f"to {self.ring.capacity} floats at once)", file=sys.stderr, flush=True)


class UdpTransport(DatagramTransport):
    """One pass of range-indexed UDP packets; no retransmission, no guarantee."""

    name = "udp"


# ---- helpers --------------------------------------------------------------------------


def _start_mbit(rate_bit: float | None) -> int:
    """BEGIN's start rate: ``rate_bit`` in whole Mbit/s, rounded to the nearest (the
    receiver's idea of it is off by at most 0.5 Mbit/s); 0 for none or one that does
    not fit the field."""
    if rate_bit is None:
        return 0
    mbit = round(rate_bit / 1e6)
    return mbit if mbit <= 0xFFFF else 0


def _in_order(values: np.ndarray) -> list[int]:
    """The distinct ``values`` in order of first appearance."""
    _, first = np.unique(values, return_index=True)
    return [int(values[i]) for i in sorted(first.tolist())]


def _ifname_of(ip: str) -> str:
    """The interface in this network namespace that holds address ``ip``."""
    name = interfaces.holding(ip)
    if name is None:
        raise base.TransportError(f"no interface holds {ip} in this network namespace")
    return name


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
