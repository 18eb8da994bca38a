"""The parameters multicast at the ToR (ebpf/mcast.bpf.c), from the roles' side: the
PS's Publisher sends each rack one copy of an iteration's model, one datagram per slot
of 360 float32 values, to the rack's multicast address (the ToR copies it to every
worker of the rack), and serves the workers' repairs; a worker's Receiver takes the
copies into its model and asks the PS again for the slots that did not arrive.

Loss is repaired, not tolerated: a missing gradient contribution only reweights one
iteration's mean (in-network aggregation's bounded-loss semantics), but a missing
parameter would leave the worker computing its gradient at a point no other worker
uses, an error that stays until that slot arrives again. A repair costs a request and
the slot's datagram, unicast from the PS (the ToR keeps no copy).

When to ask: the PS tells each worker over TCP, after the copies, that PARAMS(i) went
out (tailcut.training.ps); the copies and that message take the same FIFO path, so
when it arrives every copy is in the worker's socket or lost. The worker waits a
little for stragglers (settle_s, a copy handled on the other CPU), then asks for the
rest, again every resend_s until they are in. The PS answers a repair only for the
iteration it last published, which under BSP is the one every worker is receiving.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from dataclasses import dataclass

import numpy as np

from tailcut.datapath import mcastformat as fmt
from tailcut.transports import base, sender, slots
from tailcut.transports.hot import SO_NO_CHECK

slots.check_layout(fmt.header())
SO_RCVBUFFORCE = 33   # <asm-generic/socket.h>; Python does not export it
RECV_BATCH = 256   # copies read per recvmmsg call at most
RCVBUF_BYTES = 16 << 20   # a whole model's copies (~2.3 KB each in the kernel) and more
MAX_ELEMENTS = fmt.MAX_ELEMENTS   # the most values a multicast model may have


@dataclass(frozen=True)
class Header:
    op: int
    status: int
    worker: int
    job: int
    iteration: int
    slot: int
    count: int
    rack: int
    reserved: int


def packet(op: int, *, job: int, iteration: int, slot: int, payload: bytes,
           count: int, worker: int = 0) -> bytes:
    return slots.packet(fmt.const("MAGIC"), fmt.const("VERSION"), op, job=job,
                        iteration=iteration, slot=slot, payload=payload, count=count,
                        worker=worker)


def parse(data: bytes) -> Header:
    """The header; ProtocolError if the datagram is not one of ours."""
    return slots.parse(data, fmt.const("MAGIC"), fmt.const("VERSION"), "multicast packet",
                       Header)[0]


def _socket(bind: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF_BYTES)
    except PermissionError:   # not root (a pod without NET_ADMIN): as much as allowed
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    # No UDP checksum (legal over IPv4): the ToR rewrites every copy's destination.
    sock.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
    try:
        sock.bind((bind, fmt.PORT))
    except OSError:
        sock.close()
        raise
    return sock


@dataclass
class PublisherStats:
    published: int = 0        # iterations sent to the racks
    datagrams: int = 0        # datagrams sent to the racks' addresses
    repair_requests: int = 0  # REPAIRs taken
    repaired_slots: int = 0   # slots sent again, to one worker each
    stale_requests: int = 0   # REPAIRs of an iteration not the last published
    malformed: int = 0
    unsent: int = 0           # iterations the kernel refused to send (the path was down)


class Publisher:
    """The PS's side: one copy per rack of each iteration's model; repairs, in a
    thread, for the last iteration published."""

    def __init__(self, job: int, elements: int, racks: list[str], bind: str) -> None:
        if not 0 < elements <= fmt.MAX_ELEMENTS:
            raise ValueError(f"a model of {elements} values: must be in 1..{fmt.MAX_ELEMENTS}")
        self.job, self.elements, self.racks = job, elements, racks
        self.slots = fmt.slots(elements)
        self.stats = PublisherStats()
        self._lock = threading.Lock()
        self._iteration = -1
        self.sock = _socket(bind)
        # Rack by rack: the first rack's workers start first. One sendmmsg batch per
        # rack, gathered from the headers and the model in place (slots.py).
        self._copies = slots.Outgoing(
            self.sock, [(address, fmt.PORT) for address in racks], magic=fmt.const("MAGIC"),
            version=fmt.const("VERSION"), op=fmt.PARAMS, job=job, worker=0,
            elements=elements, stride=fmt.STRIDE, dtype="<f4")
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name="mcast-repairs", daemon=True)
        self._thread.start()

    @property
    def iteration(self) -> int:
        """The iteration last published (-1: none yet)."""
        return self._iteration

    def publish(self, iteration: int, params: np.ndarray) -> None:
        """Send every rack the model of ``iteration``, one datagram per slot."""
        values = np.asarray(params, dtype="<f4")
        if values.shape != (self.elements,):
            raise ValueError(f"PARAMS of {values.size} values; the model has {self.elements}")
        with self._lock:  # repairs read the same buffers
            self._copies.put(iteration, values)
            self._iteration = iteration
        try:
            self._copies.send()
        except OSError as err:
            # The PS's link gone for a moment (a node agent restarting): the copies
            # are lost, and the workers ask for every slot again until it is back.
            if err.errno not in sender.PATH_DOWN:
                raise
            self.stats.unsent += 1
        else:
            self.stats.datagrams += len(self._copies) * len(self.racks)
        self.stats.published += 1

    def close(self) -> None:
        self._closing = True
        self._thread.join(timeout=2.0)
        self.sock.close()

    def _serve(self) -> None:
        while not self._closing:
            readable, _, _ = select.select([self.sock], [], [], 0.1)
            if not readable:
                continue
            try:
                data, peer = self.sock.recvfrom(65536)
            except OSError:
                continue
            self._repair(data, peer)

    def _repair(self, data: bytes, peer: tuple[str, int]) -> None:
        try:
            h = parse(data)
        except base.ProtocolError:
            h = None
        if h is None or h.op != fmt.REPAIR or h.job != self.job:
            self.stats.malformed += 1
            return
        wanted = np.frombuffer(data, dtype="<u4", offset=fmt.header().size)
        with self._lock:
            if h.iteration != self._iteration:
                self.stats.stale_requests += 1
                return
            self.stats.repair_requests += 1
            repairs = [self._copies.datagram(s, worker=h.worker)
                       for s in wanted.tolist() if s < self.slots]
        for data in repairs:
            try:
                self.sock.sendto(data, peer)
            except OSError as err:
                if err.errno not in sender.PATH_DOWN:
                    raise
                return   # the worker asks again
            self.stats.repaired_slots += 1


@dataclass
class ReceiverStats:
    copies: int = 0           # copies taken (the ToR's, and repairs)
    repaired: int = 0         # slots that arrived only after a repair request
    requests: int = 0         # REPAIR datagrams sent (with resends)
    lossy_iterations: int = 0  # iterations with at least one slot to repair
    stale: int = 0            # datagrams of an earlier iteration (a late repair)
    malformed: int = 0


class Receiver:
    """A worker's side: takes an iteration's copies into its model, repairing loss."""

    def __init__(self, job: int, worker: int, elements: int, ps: str, *,
                 settle_s: float = 0.002, resend_s: float = 0.005,
                 bind: str = "0.0.0.0") -> None:
        self.job, self.worker, self.elements = job, worker, elements
        self.ps = (ps, fmt.PORT)
        self.settle_s, self.resend_s = settle_s, resend_s
        self.slots = fmt.slots(elements)
        self.stats = ReceiverStats()
        self.sock = _socket(bind)
        self.sock.setblocking(False)
        self._incoming = slots.Incoming(self.sock, RECV_BATCH,
                                        fmt.header().size + 4 * fmt.STRIDE)

    def close(self) -> None:
        self.sock.close()

    def receive(self, iteration: int, params: np.ndarray, timeout_s: float) -> int:
        """Write the model of ``iteration`` into ``params``. Call once the PS said it
        sent it; returns how many slots had to be repaired. TransportTimeout if the PS
        does not repair them within timeout_s."""
        started = time.monotonic()
        got = np.zeros(self.slots, dtype=bool)
        self._drain(iteration, params, got)
        settle = started + self.settle_s
        while not got.all() and time.monotonic() < settle:
            self._wait(settle - time.monotonic())
            self._drain(iteration, params, got)
        missing = int(self.slots - np.count_nonzero(got))
        if missing:
            self.stats.lossy_iterations += 1
        while not got.all():
            if time.monotonic() - started > timeout_s:
                raise base.TransportTimeout(
                    f"multicast: {int(np.count_nonzero(~got))} slots of iteration "
                    f"{iteration} not repaired by the PS in {timeout_s:.0f} s")
            self._ask(iteration, np.flatnonzero(~got))
            due = time.monotonic() + self.resend_s
            while not got.all() and time.monotonic() < due:
                self._wait(due - time.monotonic())
                self._drain(iteration, params, got)
        self.stats.repaired += missing
        return missing

    def _wait(self, seconds: float) -> None:
        select.select([self.sock], [], [], max(0.0, seconds))

    def _ask(self, iteration: int, slots: np.ndarray) -> None:
        per = fmt.STRIDE   # slot numbers in one datagram, as many as values
        for lo in range(0, slots.size, per):
            chunk = slots[lo:lo + per].astype("<u4")
            try:
                self.sock.sendto(packet(fmt.REPAIR, job=self.job, iteration=iteration,
                                        slot=0, payload=chunk.tobytes(), count=chunk.size,
                                        worker=self.worker % 256), self.ps)
            except (BlockingIOError, InterruptedError):
                return   # the socket's buffer is full: receive() asks again shortly
            except OSError as err:
                if err.errno not in sender.PATH_DOWN:
                    raise
                return   # the path is down for a moment: asked again shortly too
            self.stats.requests += 1

    def _drain(self, iteration: int, params: np.ndarray, got: np.ndarray) -> None:
        """Take every datagram waiting, a recvmmsg batch at a time, each batch checked
        and put in place with numpy (a model is a thousand copies an iteration)."""
        size, stride = fmt.header().size, fmt.STRIDE
        full_slots = self.elements // stride
        # The model's whole slots as rows, to take a batch of copies in one assignment.
        rows_of = (params[:full_slots * stride].reshape(full_slots, stride)
                   if params.flags.c_contiguous and params.dtype == np.float32 else None)
        while True:
            headers, payload, lengths = self._incoming.recv()
            if not len(headers):
                return
            slot = headers["slot"].astype(np.int64)
            count = headers["count"].astype(np.int64)
            ok = ((headers["magic"] == fmt.const("MAGIC"))
                  & (headers["version"] == fmt.const("VERSION"))
                  & (headers["op"] == fmt.PARAMS) & (headers["job"] == self.job)
                  & (slot < self.slots))
            # Only now is slot known to be in range: its length, and the datagram's.
            ok &= (count == np.minimum(stride, self.elements - np.where(ok, slot, 0) * stride))
            ok &= lengths == size + 4 * count
            self.stats.malformed += int(len(ok) - np.count_nonzero(ok))
            current = ok & (headers["iteration"] == iteration)
            self.stats.stale += int(np.count_nonzero(ok & ~current))
            taken = np.flatnonzero(current)
            values = payload[:, :4 * stride].view("<f4")
            whole = taken[count[taken] == stride]
            if rows_of is not None:
                rows_of[slot[whole]] = values[whole]
            else:
                for i in whole.tolist():
                    params[slot[i] * stride:(slot[i] + 1) * stride] = values[i]
            for i in taken[count[taken] != stride].tolist():  # the model's last slot
                params[slot[i] * stride:slot[i] * stride + count[i]] = values[i, :count[i]]
            got[slot[taken]] = True
            self.stats.copies += len(taken)
