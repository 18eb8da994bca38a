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
from dataclasses import dataclass

import numpy as np

from tailcut.datapath import aggformat as fmt
from tailcut.transports import base, sender, slots
from tailcut.transports.hot import SO_NO_CHECK

slots.check_layout(fmt.header())
RANGE = 127.0   # Q8.24 holds +-128; a rack's sum must stay inside it
MAX_ELEMENTS = fmt.MAX_ELEMENTS   # the most a gradient the ToR sums may have
RECV_BATCH = 256   # sums read per recvmmsg call at most
RING = fmt.const("RING")   # iterations the ToR keeps per slot
MEMBERS, RACK = "word9", "word10"   # slots.HEADER's last two words, in ebpf/agg.h


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
    return slots.packet(fmt.const("MAGIC"), fmt.const("VERSION"), op, worker=worker,
                        job=job, iteration=iteration, slot=slot, payload=payload)


def parse(data: bytes) -> tuple[Header, np.ndarray]:
    """An AGGREGATE's or a FLUSH answer's header and values; ProtocolError if malformed."""
    header, payload = slots.parse(data, fmt.const("MAGIC"), fmt.const("VERSION"),
                                  "aggregation packet", Header)
    return header, np.frombuffer(payload, dtype="<i4")


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
        self.unsent = 0   # ADDs the kernel refused (the path was down)
        self.sock = _socket()
        self._adds = slots.Outgoing(self.sock, [self.address], magic=fmt.const("MAGIC"),
                                    version=fmt.const("VERSION"), op=fmt.ADD, job=job,
                                    worker=worker, elements=elements, stride=fmt.STRIDE,
                                    dtype="<i4")
        # The conversion's one buffer, reused: fmt.to_fixed made five new arrays a
        # call, 1.7 ms of a worker's CPU an iteration for the bench's 92k values (most
        # of it their page faults), 8 workers on 2 cores.
        self._scaled = np.empty(elements, dtype=np.float64)

    def close(self) -> None:
        self.sock.close()

    def send(self, iteration: int, grad: np.ndarray) -> None:
        """One ADD per slot; nothing comes back (a lost one shows at the PS's FLUSH)."""
        self._adds.put(iteration, self.fixed(grad), casting="unsafe")
        try:
            self._adds.send()
        except OSError as err:
            # The worker's link gone for a moment (a node agent restarting): its ADDs
            # are lost, which the PS's FLUSH of the slots shows and repairs.
            if err.errno not in sender.PATH_DOWN:
                raise
            self.unsent += len(self._adds)
            return
        self.packets += len(self._adds)

    def fixed(self, grad: np.ndarray) -> np.ndarray:
        """fmt.to_fixed of grad clipped to +-limit (float64: exact; the rounding is
        to_fixed's), counting what was clipped; a view of the reused buffer, whose
        values are integers inside s32."""
        scaled = self._scaled
        np.clip(grad, -self.limit, self.limit, out=scaled)
        self.saturated += int(np.count_nonzero(scaled != grad))
        np.multiply(scaled, fmt.SCALE, out=scaled)
        np.rint(scaled, out=scaled)
        return scaled


@dataclass
class Rack:
    """A rack whose ToR sums its workers: where to FLUSH, who is in its group."""
    index: int
    address: str
    workers: tuple[int, ...]


class Iteration:
    """What the PS got of one iteration, per (rack, slot) as rows of arrays: whether
    its sum is in, the members' bitmap, and the sum (the slot's values, zero-padded to
    a whole slot)."""

    def __init__(self, racks: int, slots: int) -> None:
        self.have = np.zeros((racks, slots), dtype=bool)
        self.members = np.zeros((racks, slots), dtype=np.int64)
        self.values = np.zeros((racks, slots, fmt.STRIDE), dtype=np.int32)
        self.taken = 0        # sums in (have's count)
        self.flushed = 0      # slots the PS had to ask for
        self.missing = 0      # members' contributions not in the sums (lost or late)


@dataclass
class Stats:
    forwarded: int = 0    # AGGREGATE packets taken
    flushes: int = 0      # FLUSH requests sent (with resends)
    not_ready: int = 0    # FLUSH answered NOT_READY
    late: int = 0         # sums of iterations already applied
    malformed: int = 0    # packets the collector could not parse or did not expect


def _popcount(bitmaps: np.ndarray) -> np.ndarray:
    """Set bits of each u32 bitmap."""
    as_bytes = bitmaps.astype("<u4").view(np.uint8).reshape(*bitmaps.shape, 4)
    bits: np.ndarray = np.unpackbits(as_bytes, axis=-1).sum(axis=-1, dtype=np.int64)
    return bits


class Collector:
    """The PS's side: takes the racks' sums a recvmmsg batch at a time, checked with
    numpy (slots.py), and hands one iteration's over. collect() reads the socket
    itself; between calls a thread keeps it from filling, a batch every batch_s.

    It used to read and parse one datagram at a time in the thread and wake the
    waiting collect() for each: 512 sums an iteration (8 workers in 2 racks) cost the
    PS ~15 ms of CPU, on a 2-core machine where the datagrams through the ToR already
    cost the workers theirs. A batch costs ~0.3 ms however small, so the thread waits
    batch_s for a batch to build up (~170 sums at 1 Gbit/s)."""

    def __init__(self, job: int, elements: int, racks: list[Rack], *,
                 grace_s: float = 0.005, most_s: float = 0.1, resend_s: float = 0.005,
                 batch_s: float = 0.002, bind: str = "0.0.0.0") -> None:
        self.job, self.elements, self.racks = job, elements, racks
        self.grace_s, self.most_s, self.resend_s = grace_s, most_s, resend_s
        self.batch_s = batch_s
        self.slots = fmt.slots(elements)
        self._rack_ids = np.array([r.index for r in racks], dtype=np.int64)
        self._row = {r.index: i for i, r in enumerate(racks)}   # rack -> its arrays' row
        self._members = np.array([len(r.workers) for r in racks], dtype=np.int64)
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
        self._incoming = slots.Incoming(self.sock, RECV_BATCH,
                                        fmt.header().size + 4 * fmt.STRIDE)
        self._reading = threading.Lock()   # one reader at a time: a batch is one buffer
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
                time.sleep(self.batch_s)
                self._drain()

    def _drain(self) -> None:
        """Take every datagram waiting in the socket (the thread's, or collect()'s)."""
        with self._reading:
            while True:
                try:
                    headers, payload, lengths = self._incoming.recv()
                except OSError:   # closed
                    return
                if not len(headers):
                    return
                self._take(headers, payload, lengths)

    def _iteration(self, iteration: int) -> Iteration:
        got = self._got.get(iteration)
        if got is None:
            got = self._got[iteration] = Iteration(len(self.racks), self.slots)
        return got

    def _take(self, headers: np.ndarray, payload: np.ndarray, lengths: np.ndarray) -> None:
        """A batch of datagrams: the sums kept (the first of a sum and its FLUSH
        answer), the rest counted; the waiter woken once."""
        size, stride = fmt.header().size, fmt.STRIDE
        slot = headers["slot"].astype(np.int64)
        count = headers["count"].astype(np.int64)
        op, status = headers["op"], headers["status"]
        is_rack = headers[RACK][:, None] == self._rack_ids[None, :]
        rack = np.argmax(is_rack, axis=1)   # its arrays' row (0 for no rack: refused)
        ok = ((headers["magic"] == fmt.const("MAGIC"))
              & (headers["version"] == fmt.const("VERSION"))
              & (headers["job"] == self.job) & is_rack.any(axis=1) & (slot < self.slots))
        # Only now is slot known to be in range: its length, and the datagram's.
        ok &= count == np.minimum(stride, self.elements - np.where(ok, slot, 0) * stride)
        ok &= lengths == size + 4 * count
        not_ready = ok & (op == fmt.FLUSH) & (status == fmt.NOT_READY)
        forwarded = ok & (op == fmt.AGGREGATE)
        taken = forwarded | (ok & (op == fmt.FLUSH) & ((status == fmt.OK)
                                                       | (status == fmt.STALE)))
        with self._cond:
            # Under BSP no sum is ahead of the next iteration; the ToR's ring holds
            # three: beyond them is no sum of ours (and would cost an Iteration each).
            taken &= headers["iteration"] <= self._want + RING - 1
            self.stats.malformed += int(len(ok) - np.count_nonzero(taken | not_ready))
            self.stats.not_ready += int(np.count_nonzero(not_ready))
            self.stats.forwarded += int(np.count_nonzero(forwarded & taken))
            late = taken & (headers["iteration"] < self._want)
            self.stats.late += int(np.count_nonzero(late))
            taken &= ~late
            for iteration in np.unique(headers["iteration"][taken]).tolist():
                got = self._iteration(iteration)
                rows = np.flatnonzero(taken & (headers["iteration"] == iteration))
                # the first of each (rack, slot), in the batch and before it
                _, first = np.unique(rack[rows] * self.slots + slot[rows], return_index=True)
                rows = rows[np.sort(first)]
                rows = rows[~got.have[rack[rows], slot[rows]]]
                r, s = rack[rows], slot[rows]
                got.values[r, s] = payload[rows, :4 * stride].view("<i4")
                for i in np.flatnonzero(count[rows] < stride).tolist():  # the last slot
                    got.values[r[i], s[i], count[rows[i]]:] = 0           # (rows' rest)
                got.members[r, s] = np.where(status[rows] == fmt.OK, headers[MEMBERS][rows], 0)
                got.have[r, s] = True
                got.taken += len(rows)
                self._arrived += len(rows)
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
        whole = len(self.racks) * self.slots

        def complete() -> bool:
            got = self._got.get(iteration)
            return got is not None and got.taken == whole
        with self._cond:
            self._want = iteration
        while True:
            self._drain()
            with self._cond:
                if complete() or time.monotonic() - started >= self.most_s:
                    break
                before = self._arrived
                self._cond.wait(timeout=self.grace_s)   # the thread's next batch
            if self._arrived == before:
                self._drain()   # the thread may not have run on a busy machine
                if self._arrived == before:
                    break   # quiet for grace_s: what is missing was lost
        with self._cond:
            got = self._iteration(iteration)
            missing = {(self.racks[r].index, int(s)) for r, s in np.argwhere(~got.have)}
        got.flushed = len(missing)
        if missing:
            self._flush(iteration, missing, started, timeout_s)
        with self._cond:
            del self._got[iteration]
            self._want = iteration + 1
            for stale in [k for k in self._got if k <= iteration]:
                del self._got[stale]
        contributors = _popcount(got.members)               # (rack, slot)
        got.missing = int((self._members[:, None] - contributors).sum())
        got.values[contributors == 0] = 0   # an empty FLUSH answer adds nothing
        # float64 holds a sum of s32s exactly; one new array each (a fresh one costs its
        # page faults, more than the arithmetic)
        total = got.values.sum(axis=0, dtype=np.float64).reshape(-1)[:self.elements]
        total /= fmt.SCALE
        counts = np.repeat(contributors.sum(axis=0).astype(np.float64), fmt.STRIDE)
        return total, counts[:self.elements], got

    def _flush(self, iteration: int, missing: set[tuple[int, int]], started: float,
               timeout_s: float) -> None:
        address = {r.index: r.address for r in self.racks}
        due = {key: 0.0 for key in missing}
        while True:
            self._drain()
            with self._cond:
                have = self._got[iteration].have
                due = {k: t for k, t in due.items() if not have[self._row[k[0]], k[1]]}
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
                due[(rack, s)] = now + self.resend_s
                try:
                    self.sock.sendto(packet(fmt.FLUSH, worker=fmt.PS_WORKER, job=self.job,
                                            iteration=iteration, slot=s,
                                            payload=bytes(4 * n)), (address[rack], fmt.PORT))
                except OSError as err:   # the path down for a moment: sent again
                    if err.errno not in sender.PATH_DOWN:
                        raise
                    continue
                self.stats.flushes += 1
            with self._cond:
                self._cond.wait(timeout=self.resend_s / 2)
