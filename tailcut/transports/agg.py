"""In-network aggregation (ebpf/agg.bpf.c) from the roles' side: a worker's Sender puts
its gradient on the wire to its rack's ToR, one datagram per slot; the PS's Collector
receives each rack's sums and, for the slots still missing once every worker has moved
on, asks the ToR for what it has (FLUSH).

Values travel as Q8.24 (tailcut.datapath.torformat): a value is off by at most 2^-25
(3.0e-8) after conversion, and a sum of n is exact in integers, so the mean the PS
computes is within 2^-25 of the mean of the converted values. A rack of n workers
sums into the same s32, so each sender clamps its values to +-127/n (counted as
saturated). The layout and every constant come from ebpf/agg.h.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from tailcut.datapath import aggformat as fmt
from tailcut.transports import base, slots
from tailcut.transports.hot import SO_NO_CHECK

slots.check_layout(fmt.header())
RANGE = 127.0   # Q8.24 holds +-128; a rack's sum must stay inside it
MAX_ELEMENTS = fmt.MAX_ELEMENTS   # the most a gradient the ToR sums may have


@dataclass(frozen=True)
class Header:
    op: int
    status: int
    worker: int
    job: int
    iteration: int
    slot: int
    count: int
    members: int
    rack: int


def packet(op: int, *, worker: int, job: int, iteration: int, slot: int,
           payload: bytes) -> bytes:
    """A request (ADD or FLUSH): header then payload (s32 values, little-endian)."""
    return fmt.header().pack(fmt.const("MAGIC"), fmt.const("VERSION"), op, 0, worker, job,
                             iteration, slot, len(payload) // 4, 0, 0) + payload


def parse(data: bytes) -> tuple[Header, np.ndarray]:
    """An AGGREGATE's or a FLUSH answer's header and values; ProtocolError if malformed."""
    size = fmt.header().size
    if len(data) < size:
        raise base.ProtocolError(f"aggregation packet: {len(data)} bytes, header is {size}")
    magic, version, *fields = fmt.header().unpack_from(data)
    if magic != fmt.const("MAGIC") or version != fmt.const("VERSION"):
        raise base.ProtocolError(f"aggregation packet: magic {magic:#x} version {version}")
    h = Header(*fields)
    if len(data) != size + 4 * h.count:
        raise base.ProtocolError(f"aggregation packet: {len(data)} bytes for count {h.count}")
    return h, np.frombuffer(data, dtype="<i4", offset=size)


def _socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    # No UDP checksum (legal over IPv4): the ToR rewrites packets and sets none either.
    sock.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
    return sock


class Sender:
    """A worker's side: its whole gradient to its rack's aggregation address, one ADD
    per slot, all of them by sendmmsg (slots.py)."""

    def __init__(self, address: str, job: int, worker: int, elements: int,
                 rack_size: int) -> None:
        if not 0 < elements <= fmt.MAX_ELEMENTS:
            raise ValueError(f"gradient of {elements} values: must be in 1..{fmt.MAX_ELEMENTS}")
        self.address = (address, fmt.PORT)
        self.job, self.worker, self.elements = job, worker, elements
        self.limit = RANGE / rack_size
        self.saturated = 0
        self.packets = 0
        self.sock = _socket()
        self._adds = slots.Outgoing(self.sock, [self.address], magic=fmt.const("MAGIC"),
                                    version=fmt.const("VERSION"), op=fmt.ADD, job=job,
                                    worker=worker, elements=elements, stride=fmt.STRIDE,
                                    dtype="<i4")

    def close(self) -> None:
        self.sock.close()

    def send(self, iteration: int, grad: np.ndarray) -> None:
        """One ADD per slot; nothing comes back (a lost one shows at the PS's FLUSH)."""
        clipped = np.clip(grad, -self.limit, self.limit)
        self.saturated += int(np.count_nonzero(clipped != grad))
        fixed, _ = fmt.to_fixed(clipped)
        self._adds.put(iteration, fixed)
        self._adds.send()
        self.packets += len(self._adds)


@dataclass
class Rack:
    """A rack whose ToR sums its workers: where to FLUSH, who is in its group."""
    index: int
    address: str
    workers: tuple[int, ...]


@dataclass
class Iteration:
    """What the PS got of one iteration: per (rack, slot), the members' bitmap and sum."""
    sums: dict[tuple[int, int], tuple[int, np.ndarray]] = field(default_factory=dict)
    flushed: int = 0      # slots the PS had to ask for
    missing: int = 0      # members' contributions not in the sums (lost or late)


@dataclass
class Stats:
    forwarded: int = 0    # AGGREGATE packets taken
    flushes: int = 0      # FLUSH requests sent (with resends)
    not_ready: int = 0    # FLUSH answered NOT_READY
    late: int = 0         # sums of iterations already applied
    malformed: int = 0    # packets the collector could not parse or did not expect


class Collector:
    """The PS's side: receives the racks' sums in a thread, hands one iteration's over."""

    def __init__(self, job: int, elements: int, racks: list[Rack], *,
                 grace_s: float = 0.005, most_s: float = 0.1, resend_s: float = 0.005,
                 bind: str = "0.0.0.0") -> None:
        self.job, self.elements, self.racks = job, elements, racks
        self.grace_s, self.most_s, self.resend_s = grace_s, most_s, resend_s
        self.slots = fmt.slots(elements)
        self._known = {r.index for r in racks}
        # every (rack, slot) of an iteration: what collect() waits for
        self._all = {(r.index, s) for r in racks for s in range(self.slots)}
        self.stats = Stats()
        self._want = 0                          # the iteration being collected
        self._got: dict[int, Iteration] = {}    # iteration -> what arrived so far
        self._arrived = 0                       # sums taken so far, any iteration
        self._cond = threading.Condition()
        self.sock = _socket()
        try:
            self.sock.bind((bind, fmt.PORT))
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self._closing = False
        self._thread = threading.Thread(target=self._receive, name="agg-collector",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closing = True
        self._thread.join(timeout=2.0)
        self.sock.close()

    def _receive(self) -> None:
        while not self._closing:
            readable, _, _ = select.select([self.sock], [], [], 0.1)
            if readable:
                self._drain()

    def _drain(self) -> None:
        """Take every datagram waiting in the socket (the thread's loop, and collect()
        before it flushes: the thread may not have run yet on a busy machine)."""
        while True:
            try:
                data = self.sock.recv(65536)
            except (BlockingIOError, OSError):
                return
            self._take(data)

    def _take(self, data: bytes) -> None:
        try:
            h, values = parse(data)
        except base.ProtocolError:
            h = None
        with self._cond:
            if (h is None or h.job != self.job or h.rack not in self._known
                    or h.slot >= self.slots
                    or h.count != fmt.slot_length(self.elements, h.slot)):
                self.stats.malformed += 1
                return
            if h.op == fmt.FLUSH and h.status == fmt.NOT_READY:
                self.stats.not_ready += 1
                return
            if h.op == fmt.AGGREGATE:
                self.stats.forwarded += 1
            elif h.op != fmt.FLUSH or h.status not in (fmt.OK, fmt.STALE):
                self.stats.malformed += 1
                return
            if h.iteration < self._want:
                self.stats.late += 1
                return
            it = self._got.setdefault(h.iteration, Iteration())
            if (h.rack, h.slot) not in it.sums:   # the first of a sum and its FLUSH answer
                members = h.members if h.status == fmt.OK else 0
                it.sums[(h.rack, h.slot)] = (members, values.copy())
                self._arrived += 1
            self._cond.notify_all()

    def collect(self, iteration: int, timeout_s: float = 60.0
                ) -> tuple[np.ndarray, np.ndarray, Iteration]:
        """Every rack's sums of ``iteration``: (sum, contributors per element, what
        happened), float64. Call when every worker has sent its gradient (asked for the
        next iteration): the forwarded sums are then on their way or in; they are
        waited for while they keep coming (until none came for grace_s, at most
        most_s), and the rest are flushed. ProtocolError if a ToR does not answer
        within timeout_s."""
        started = time.monotonic()

        def complete() -> bool:
            return self._all <= self._got.get(iteration, Iteration()).sums.keys()
        with self._cond:
            self._want = iteration
            while not complete() and time.monotonic() - started < self.most_s:
                before = self._arrived
                if not self._cond.wait_for(complete, timeout=self.grace_s) and \
                        self._arrived == before:
                    break   # quiet for grace_s: what is missing was lost
        self._drain()   # the thread may not have run on a busy machine
        with self._cond:
            got = self._got.setdefault(iteration, Iteration())
            missing = self._all - got.sums.keys()
        got.flushed = len(missing)
        if missing:
            self._flush(iteration, missing, started, timeout_s)
        total = np.zeros(self.elements, dtype=np.float64)
        counts = np.zeros(self.elements, dtype=np.float64)
        expected = {r.index: len(r.workers) for r in self.racks}
        with self._cond:
            del self._got[iteration]
            self._want = iteration + 1
            for stale in [k for k in self._got if k <= iteration]:
                del self._got[stale]
        for (rack, s), (members, values) in sorted(got.sums.items()):
            n = bin(members).count("1")
            got.missing += expected[rack] - n
            if n:
                lo = s * fmt.STRIDE
                total[lo:lo + values.size] += values
                counts[lo:lo + values.size] += n
        return total / fmt.SCALE, counts, got

    def _flush(self, iteration: int, missing: set[tuple[int, int]], started: float,
               timeout_s: float) -> None:
        address = {r.index: r.address for r in self.racks}
        due = {key: 0.0 for key in missing}
        while True:
            with self._cond:
                due = {k: t for k, t in due.items() if k not in self._got[iteration].sums}
                if not due:
                    return
                now = time.monotonic()
                if now - started > timeout_s:
                    raise base.ProtocolError(
                        f"aggregation: racks/slots {sorted(due)[:8]} of iteration {iteration} "
                        f"not answered in {timeout_s:.0f} s (is the ToR program attached?)")
                send = [k for k, t in due.items() if t <= now]
            for rack, s in send:
                n = fmt.slot_length(self.elements, s)
                self.sock.sendto(packet(fmt.FLUSH, worker=fmt.PS_WORKER, job=self.job,
                                        iteration=iteration, slot=s, payload=bytes(4 * n)),
                                 (address[rack], fmt.PORT))
                self.stats.flushes += 1
                due[(rack, s)] = now + self.resend_s
            with self._cond:
                self._cond.wait(timeout=self.resend_s / 2)
