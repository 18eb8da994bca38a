"""The hot-parameter store in the ToR (ebpf/tor.bpf.c), from a worker's or the PS's side:
packets, fixed point, and a client that pulls and pushes a whole hot vector.

Values travel as Q8.24 (s32, v / 2^24): float arithmetic is not available in BPF, and
integer addition gives the same sum in any arrival order. A value is off by at most
2^-25 (3.0e-8) when it is converted, and every push adds at most another 2^-25 (its
own rounding), so after T pushes an element is within T * 2^-25 of the float sum; the
range is +-128 (a larger value or update saturates, and the client counts it).

The layout and every constant come from ebpf/tor.h, the header the program compiles
with (tailcut.datapath.torformat).
"""

from __future__ import annotations

import select
import socket
import time
from dataclasses import dataclass

import numpy as np

from tailcut.transports import base, sender
from tailcut.transports import slots as slot_wire   # (hot.slots is the format's)

from tailcut.datapath.torformat import (  # noqa: F401 - the format, re-exported
    COUNTS as COUNTS, DUPLICATE as DUPLICATE, MAX_ELEMENTS as MAX_ELEMENTS,
    NOT_READY as NOT_READY, OK as OK, PORT as PORT, PS_WORKER as PS_WORKER, PULL as PULL,
    PUSH as PUSH, SCALE as SCALE, STALE as STALE, STRIDE as STRIDE, const as const,
    from_fixed as from_fixed, header as header, reasons as reasons, slot_length as slot_length,
    slots as slots, to_fixed as to_fixed)


slot_wire.check_layout(header())   # the header every ToR protocol shares


@dataclass(frozen=True)
class Header:
    op: int
    status: int
    worker: int
    job: int
    iteration: int
    slot: int
    count: int
    word9: int    # unused by the store
    word10: int


def packet(op: int, *, worker: int, job: int, iteration: int, slot: int,
           payload: bytes) -> bytes:
    """A request: header then payload (``count`` s32 values, little-endian)."""
    return slot_wire.packet(const("MAGIC"), const("VERSION"), op, worker=worker, job=job,
                            iteration=iteration, slot=slot, payload=payload)


def parse(data: bytes) -> tuple[Header, bytes]:
    """A reply's header and payload; a ProtocolError naming what is wrong."""
    return slot_wire.parse(data, const("MAGIC"), const("VERSION"), "hot store reply", Header)


@dataclass
class Stats:
    """What a client saw: requests sent (with resends), NOT_READY answers, saturation."""
    requests: int = 0
    resends: int = 0
    not_ready: int = 0
    saturated: int = 0


SO_NO_CHECK = 11   # <asm-generic/socket.h>; Python does not export it


class Client:
    """Pulls and pushes one job's whole hot vector, one request per slot, resending
    what is not answered (datagrams can be lost) and asking again on NOT_READY."""

    def __init__(self, address: str, job: int, worker: int, elements: int,
                 resend_s: float = 0.005, retry_s: float = 0.0002,
                 timeout_s: float = 60.0) -> None:
        if not 0 < elements <= MAX_ELEMENTS:
            raise ValueError(f"hot elements {elements}: must be in 1..{MAX_ELEMENTS}")
        self.address = (address, PORT)
        self.job, self.worker, self.elements = job, worker, elements
        self.resend_s, self.retry_s, self.timeout_s = resend_s, retry_s, timeout_s
        self.stats = Stats()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        # No UDP checksum (legal over IPv4): the ToR rewrites requests into replies and
        # sets none either; a request sent with checksum offload pending would leave a
        # half-done one for a later hop (a VXLAN tunnel) to finish wrongly.
        self.sock.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
        self.sock.setblocking(False)

    def close(self) -> None:
        self.sock.close()

    def pull(self, iteration: int) -> np.ndarray:
        """The hot values of ``iteration`` (float32), once every worker pushed the one before."""
        out = np.empty(self.elements, dtype="<i4")
        self._exchange(PULL, iteration, out)
        return from_fixed(out)

    def counts(self) -> np.ndarray:
        """How many pushes changed each hot element (PS only)."""
        out = np.empty(self.elements, dtype="<i4")
        self._exchange(COUNTS, 0, out)
        return out.view(np.uint32).astype(np.int64)

    def push(self, iteration: int, update: np.ndarray) -> None:
        """Add ``update`` (already -lr / workers x gradient) to the hot values."""
        fixed, saturated = to_fixed(update)
        self.stats.saturated += saturated
        self._exchange(PUSH, iteration, fixed)

    def _exchange(self, op: int, iteration: int, values: np.ndarray) -> None:
        """Send one request per slot, resend unanswered ones, until each has its answer;
        for PULL/COUNTS the answers' values land in ``values``."""
        started = time.monotonic()
        pending: dict[int, float] = {}   # slot -> when to send it (again)
        requests: dict[int, bytes] = {}
        for s in range(slots(self.elements)):
            lo, hi = s * STRIDE, s * STRIDE + slot_length(self.elements, s)
            payload = (values[lo:hi].tobytes() if op == PUSH
                       else bytes(4 * (hi - lo)))   # room for the reply
            requests[s] = packet(op, worker=self.worker, job=self.job, iteration=iteration,
                                 slot=s, payload=payload)
            pending[s] = started
        while pending:
            now = time.monotonic()
            if now - started > self.timeout_s:
                raise base.ProtocolError(
                    f"hot store at {self.address[0]}:{PORT} did not answer slots "
                    f"{sorted(pending)[:8]} of iteration {iteration} in {self.timeout_s:.0f} s "
                    f"(is the ToR program attached?)")
            for s, due in list(pending.items()):
                if due <= now:
                    pending[s] = now + self.resend_s
                    try:
                        self.sock.sendto(requests[s], self.address)
                    except OSError as err:   # the path down for a moment: sent again
                        if err.errno not in sender.PATH_DOWN:
                            raise
                        continue
                    self.stats.requests += 1
                    if due > started:
                        self.stats.resends += 1
            wait = max(0.0, min(pending.values(), default=now) - time.monotonic())
            readable, _, _ = select.select([self.sock], [], [], wait)
            if not readable:
                continue
            while True:
                try:
                    data = self.sock.recv(65536)
                except BlockingIOError:
                    break
                header, payload = parse(data)
                s = header.slot
                if header.op != op or s not in pending or header.worker != self.worker:
                    continue   # an answer to an earlier resend
                if header.status == NOT_READY:
                    self.stats.not_ready += 1
                    pending[s] = time.monotonic() + self.retry_s
                    continue
                if header.status == STALE:
                    if op != PUSH:
                        raise base.ProtocolError(
                            f"hot store: iteration {iteration} of slot {s} is gone (the "
                            f"store is at {header.iteration})")
                    if header.iteration <= iteration:
                        continue   # an answer to an earlier iteration's resend
                elif header.iteration != iteration and op != COUNTS:
                    continue       # an answer to an earlier iteration's resend
                if op != PUSH:
                    lo = s * STRIDE
                    values[lo:lo + header.count] = np.frombuffer(payload, dtype="<i4")
                del pending[s]
