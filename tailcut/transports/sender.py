"""The datagram sender: one message's range-indexed packets, sent paced and in bursts.

A message's packets are a header row per slot plus the values themselves: each
datagram is gathered by sendmmsg from its header and from ``values[start:end]`` in
place (batch.py), so sending a 4 MiB vector copies 93 KiB of headers, not the vector.
"""

from __future__ import annotations

import errno
import functools
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tailcut.transports import base, rxfast, srpt, wire
from tailcut.transports import batch as batch_mod

ETH_BYTES = 14  # what HTB counts on top of the IP packet
# A burst (one sendmmsg, then a look at the clock and for DONE) is BURST_S of link time
# at the rate being paced, at least BURST_PACKETS and at most MAX_BURST_PACKETS: each
# burst is a wake-up of the sender thread, and on a busy machine every wake-up waits
# for a core. 0.4 ms is 33 packets at 1 Gbit/s.
BURST_PACKETS = 16
BURST_S = 0.0004
MAX_BURST_PACKETS = 128
CATCH_UP_S = 0.004  # most link time a late sender sends at once (330 packets at 1 Gbit/s)
# A pass starts with this much link time at its rate sent at once, into its own link's
# queue, which lets it out at line rate (its bucket, tailcut.net.shaping.Htb, at
# once): the link is busy from the first packet, as with a TCP sender's first window,
# for one wake-up instead of three. Only a pass that finds its sender's link idle
# (srpt.Turn.link_was_idle) takes it: one handed the link by another pass, or sent
# next to one, does not. On a path with shallow switch buffers it is at most half the
# smallest.
START_CREDIT_S = 0.001
# Longest wait for a turn on the sender's link without a look at the deadline (a
# turn's end, a grant or a DONE wakes the wait at once).
TURN_WAIT_S = 0.05
# What a send is refused with while the path is down for a moment (a pod's link
# removed and wired again by a restarting node agent, a route withdrawn): the burst is
# lost before the wire, which the receiver repairs or tolerates like any other loss.
# For at most PATH_DOWN_GRACE_S in a row: a path that stays down is a broken set-up
# (a node agent that never came back), said as such instead of as a late message.
PATH_DOWN = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN,
                       errno.EHOSTDOWN, errno.EADDRNOTAVAIL})
PATH_DOWN_GRACE_S = 60.0   # an agent restart took 6 s here; its cluster test allows 120


@dataclass
class Pass:
    """What pace() did with a pass: slots handed to the kernel, and slots of bursts
    the kernel refused because the path was down; with ``settle`` off, when (monotonic)
    the link will have carried the pass (None: it has)."""

    sent: int = 0
    unsent: int = 0
    idle_at: float | None = field(default=None, compare=False)


@dataclass
class Outage:
    """One connection's sends refused because the path is down, in a row: since when
    (monotonic; None: the last burst went out), how many datagrams, and why."""

    since: float | None = None
    unsent: int = 0
    why: str = ""

    def refused(self, count: int, errno_: int, now: float, peer: str) -> None:
        """A burst of ``count`` refused with ``errno_``; raises TransportError once the
        path has been down longer than PATH_DOWN_GRACE_S."""
        if self.since is None:
            self.since, self.unsent, self.why = now, 0, os.strerror(errno_)
        self.unsent += count
        if now - self.since > PATH_DOWN_GRACE_S:
            raise base.TransportError(
                f"sending to {peer}: {self.why} for {now - self.since:.0f} s (every "
                f"datagram refused: the sending pod's link or route is gone; is the node "
                f"agent that wires it running?)")

    def cleared(self) -> None:
        """A burst went out: the path is up."""
        self.since = None


class Packets:
    """Every packet of one message: ``headers[slot]`` and the values it carries."""

    def __init__(self, values: np.ndarray, job: int, message: int, kind: int,
                 stride: int) -> None:
        self.values = np.ascontiguousarray(values, dtype=wire.VALUE_DTYPE).reshape(-1)
        # A connection sends messages of the same few sizes again and again: their
        # slots' ranges and header rows are made once (read-only), each message's
        # header rows copied from them.
        template, self.starts, self.ends, self.lengths = _layout(job, kind, self.values.size,
                                                                 stride)
        self.headers = template.copy()
        self.headers["message"] = message

    def __len__(self) -> int:
        return len(self.headers)

    def number(self, order: np.ndarray, seq: int, flags: int) -> None:
        """Give slots ``order`` seq numbers from ``seq`` and ``flags``; LAST on the last."""
        if len(order):
            self.headers["seq"][order] = seq + np.arange(len(order))
            self.headers["flags"][order] = flags
            self.headers["flags"][order[-1]] = flags | wire.F_LAST

    def datagram(self, slot: int) -> bytes:
        """Slot ``slot``'s datagram as bytes (the path without sendmmsg)."""
        return (self.headers[slot:slot + 1].tobytes()
                + self.values[self.starts[slot]:self.ends[slot]].tobytes())

    def batch(self, sock: socket.socket, order: np.ndarray, addr: tuple[str, int],
              tos: np.ndarray | None = None, gso: bool = False
              ) -> batch_mod.Batch | batch_mod.CompiledBatch:
        """A sendmmsg batch of slots ``order``: header row, then the values in place;
        with ``tos`` (per slot), each datagram carries its slot's IP_TOS; with ``gso``,
        full-size datagrams in a row go out as one UDP GSO message. txfast.c builds
        and sends each burst where the library is loaded (rxfast.py), else numpy
        builds the whole pass ahead."""
        gso_size = int(self.lengths.max()) if gso and len(self) else None
        lib = rxfast.library()
        if lib is not None:
            return batch_mod.CompiledBatch(lib, sock, self.headers, self.values, self.starts,
                                           self.ends, order, addr, tos, gso_size)
        size = wire.HEADER_BYTES
        return batch_mod.Batch(sock, [
            batch_mod.Piece(self.headers, order * size, np.full(len(order), size)),
            batch_mod.Piece(self.values, self.starts[order] * 4,
                            (self.ends[order] - self.starts[order]) * 4)], addr,
            None if tos is None else tos[order], gso_size=gso_size)


@functools.lru_cache(maxsize=32)
def _layout(job: int, kind: int, total: int, stride: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A message's header rows but for its id (and seq, flags: numbered per pass), and
    each slot's start, end and datagram length: read-only, shared by its Packets."""
    n = wire.slots(total, stride)
    starts = np.arange(n, dtype=np.int64) * stride
    ends = np.minimum(starts + stride, total)
    h = np.zeros(n, wire.header_dtype())
    h["magic"], h["version"], h["kind"] = wire.MAGIC, wire.VERSION, kind
    h["job"], h["total"] = job, total
    h["start"], h["end"] = starts, ends
    # Datagram length; on the wire each also carries IP, UDP and Ethernet headers.
    lengths = wire.HEADER_BYTES + 4 * (ends - starts)
    for a in (h, starts, ends, lengths):
        a.flags.writeable = False
    return h, starts, ends, lengths


Rate = Callable[[], "float | None"]


def wire_bytes_before(packets: Packets, order: np.ndarray) -> np.ndarray:
    """Bytes on the wire before each packet of a pass over slots ``order``, and in all
    (the last entry): what HTB counts, Ethernet, IP and UDP headers included."""
    before = np.zeros(len(order) + 1, np.int64)
    np.cumsum(packets.lengths[order] + (wire.IP_UDP_BYTES + ETH_BYTES), out=before[1:])
    return before


def wire_bytes(packets: Packets, order: np.ndarray) -> int:
    """wire_bytes_before's last entry: a pass's bytes on the wire in all."""
    return int(packets.lengths[order].sum()) + len(order) * (wire.IP_UDP_BYTES + ETH_BYTES)


def burst_floor(whole_gso: bool, mtu: int) -> int:
    """The fewest packets a burst holds. BURST_PACKETS keeps what several senders'
    bursts put in one switch queue at once under a shallow buffer's size. With
    ``whole_gso`` (UDP GSO, and no finite switch buffer on the path) a burst is one
    whole GSO message of full datagrams: it waits in the sender's own link shaper and
    leaves it at line rate, and a message then costs a third of the wake-ups and
    system calls (bench/bl_conditions.py)."""
    if not whole_gso:
        return BURST_PACKETS
    full = wire.HEADER_BYTES + 4 * wire.elements_per_packet(mtu)
    return max(BURST_PACKETS, batch_mod.max_segments(full))


def pace(sock: socket.socket, addr: tuple[str, int], packets: Packets, order: np.ndarray,
         rate_bit: float | Rate | None, stop: threading.Event, deadline: float | None,
         peer: str, sendto: Callable[[bytes, tuple[str, int]], object] | None = None,
         tos: np.ndarray | None = None, gso: bool = False,
         burst_packets: int = BURST_PACKETS, outage: Outage | None = None,
         turn: srpt.Turn | None = None, credit_bytes: float | None = None,
         settle: bool = True) -> Pass:
    """Send slots ``order`` at ``rate_bit`` (None: as fast as the CPU allows; a callable
    is asked again after every burst, so a grant or a change in what else is being sent
    takes effect within a burst), in bursts of at least ``burst_packets``; return early
    once ``stop`` is set. With ``turn`` (the pass's place in its sender's schedule,
    srpt.py) the rate is the turn's instead, and a rate of 0 waits for the turn. A
    burst the kernel refuses because the path is down (PATH_DOWN) is lost, not an
    error, until ``outage`` (the connection's record of refusals in a row) has lasted
    PATH_DOWN_GRACE_S. ``sendto`` replaces sendmmsg with one call per datagram (a
    test's lossy socket). ``tos[slot]`` (CadentFlow) is the IP_TOS of slot's datagram.
    ``gso``: bursts go out as UDP GSO messages (batch.py says where that is right).
    ``credit_bytes`` caps the start credit (None: START_CREDIT_S of link time). Without
    ``settle`` the last burst is not slept off: the caller waits until the returned
    idle_at with a wait of its own (one wake-up of the thread fewer)."""
    batch = packets.batch(sock, order, addr, tos, gso) if sendto is None else None
    tagged = [0]  # the TOS the per-datagram path left on the socket
    rate_of: Rate = rate_bit if callable(rate_bit) else (lambda: rate_bit)
    if turn is not None and isinstance(batch, batch_mod.CompiledBatch):
        turn.on_change = batch.interrupt  # a grant, DONE or another pass ends its call
    try:
        return _pace(packets, order, rate_of if turn is None else turn.rate_bit, stop,
                     deadline, peer, batch,
                     lambda slot: _send_one(sock, addr, packets, slot, sendto, tos, tagged),
                     burst_packets, outage or Outage(), turn, credit_bytes, settle)
    finally:
        if turn is not None:
            turn.on_change = None
        if tagged[0]:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0)


def _send_one(sock: socket.socket, addr: tuple[str, int], packets: Packets, slot: int,
              sendto: Callable[[bytes, tuple[str, int]], object] | None,
              tos: np.ndarray | None, tagged: list[int]) -> None:
    """The per-datagram path: one sendto, after setting the socket's TOS to the slot's
    (exact: nothing else is in flight on this path)."""
    assert sendto is not None
    if tos is not None and int(tos[slot]) != tagged[0]:
        tagged[0] = int(tos[slot])
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tagged[0])
    sendto(packets.datagram(slot), addr)


@dataclass
class _Sends:
    """How a pass's bursts reach the kernel, and what they are paced against."""

    order: np.ndarray
    sent_bytes: np.ndarray      # wire bytes before each slot of ``order`` (txfast.c reads it)
    compiled: batch_mod.CompiledBatch | None
    batch: batch_mod.Batch | batch_mod.CompiledBatch | None
    send_one: Callable[[int], None]
    turn: srpt.Turn | None
    deadline: float | None
    peer: str


def _pace(packets: Packets, order: np.ndarray, rate_of: Rate,
          stop: threading.Event, deadline: float | None, peer: str,
          batch: batch_mod.Batch | batch_mod.CompiledBatch | None, send_one: Callable[[int], None],
          burst_packets: int, outage: Outage, turn: srpt.Turn | None = None,
          credit_bytes: float | None = None, settle: bool = True) -> Pass:
    """pace()'s loop: ``batch`` sends bursts by sendmmsg, else ``send_one`` per slot.
    A compiled batch paces the bursts of a pass alone on its link in txfast.c (one
    call, one wake-up of this thread, while nothing changes), else one a call."""
    outcome = Pass()
    sends = _Sends(order, wire_bytes_before(packets, order),
                   batch if turn is not None and isinstance(batch, batch_mod.CompiledBatch)
                   else None, batch, send_one, turn, deadline, peer)
    # what the per-burst arithmetic reads, as Python ints once per pass
    # (sent_bytes[0] is 0; an empty pass never enters the loop)
    first_datagram_bytes = int(sends.sent_bytes[1]) if len(order) else 0
    total_bytes = int(sends.sent_bytes[-1])

    def current_rate() -> float | None:
        if sends.compiled is not None:
            sends.compiled.clear()  # before the rate is read: a change after it ends the call
        return rate_of()

    rate_bit = current_rate()
    # When the link has carried what was sent so far: set at the first burst, in the
    # past by the start credit if the pass gets one.
    due: float | None = None
    idle_link = turn is None or turn.link_was_idle
    first = 0
    while first < len(order):
        if rate_bit == 0.0:   # another message of this sender has the link (srpt.py)
            if not _wait_turn(sends, stop):
                return outcome
            rate_bit = current_rate()
            due, idle_link = None, False
            continue
        count = burst = _burst_packets(rate_bit, burst_packets, first_datagram_bytes)
        if due is None:
            due, count = _start(rate_bit, idle_link, credit_bytes, count,
                                first_datagram_bytes)
        count = min(count, len(order) - first)
        start, count, due = _send_burst(sends, first, count, burst, rate_bit, due, outcome,
                                        outage)
        first = start + count
        if turn is not None:
            turn.sent(total_bytes - int(sends.sent_bytes[first]), first)
        if stop.is_set():
            return outcome
        _check_deadline(sends)
        rate_bit = current_rate()
        now = time.monotonic()
        if not rate_bit:  # as fast as the CPU allows, or (0) wait for the turn
            due = now
            continue
        # Paced against the running total, not burst by burst: a late wake-up (sleep
        # overshoot, another process on the CPU) is made up by the next bursts.
        due += 8 * float(sends.sent_bytes[first] - sends.sent_bytes[start]) / rate_bit
        if first >= len(order) and not settle:
            outcome.idle_at = due if due > now else None
            break
        due = _wait_until(due, now)
    return outcome


def _wait_turn(sends: _Sends, stop: threading.Event) -> bool:
    """Wait (a while) for this pass's turn on the sender's link; False: stopped."""
    if sends.turn is None:
        raise ValueError("a rate of 0 without a turn to wait for")
    sends.turn.wait(TURN_WAIT_S, stop)
    if stop.is_set():
        return False
    _check_deadline(sends)
    return True


def _check_deadline(sends: _Sends) -> None:
    if sends.deadline is not None and time.monotonic() > sends.deadline:
        raise base.TransportTimeout(f"sending to {sends.peer} ran out of time")


def _burst_packets(rate_bit: float | None, burst_packets: int,
                   first_datagram_bytes: int) -> int:
    """Datagrams a burst: BURST_S of link time at the rate, within its bounds."""
    if not rate_bit:
        return burst_packets
    return max(burst_packets, min(MAX_BURST_PACKETS, int(
        rate_bit * BURST_S / 8 / first_datagram_bytes)))


def _start(rate_bit: float | None, idle_link: bool, credit_bytes: float | None, count: int,
           first_datagram_bytes: int) -> tuple[float, int]:
    """The first burst's due time, in the past by the start credit if the pass gets one,
    and its size (the credit goes out at once)."""
    credit_s = START_CREDIT_S if idle_link else 0.0  # (False once it waited)
    if rate_bit and credit_bytes is not None:
        credit_s = min(credit_s, 8 * credit_bytes / rate_bit)
    if rate_bit:
        count = max(count, int(rate_bit * credit_s / 8 / first_datagram_bytes))
    return time.monotonic() - credit_s, count


def _send_burst(sends: _Sends, first: int, count: int, burst: int, rate_bit: float | None,
                due: float, outcome: Pass, outage: Outage) -> tuple[int, int, float]:
    """Hand ``count`` datagrams from ``first`` on to the kernel (a compiled batch may
    pace several bursts in one call): the start and size of the last burst sent, and
    the due time it leaves."""
    start = first
    try:
        if sends.compiled is not None:
            assert sends.turn is not None
            bursts = len(sends.order) if sends.turn.alone else 1
            start, end, due = sends.compiled.pace(first, count, burst, rate_bit, due, bursts,
                                                  sends.deadline, sends.sent_bytes,
                                                  CATCH_UP_S)
            outcome.sent += end - first
            count = end - start
        elif sends.batch is not None:
            sends.batch.send(first, count)
            outcome.sent += count
        else:
            for slot in sends.order[first:first + count]:
                sends.send_one(int(slot))
            outcome.sent += count
        outage.cleared()
    except OSError as err:
        if err.errno not in PATH_DOWN:
            raise
        if sends.compiled is not None:  # the bursts before the failed one went out
            start, end, due = sends.compiled.failed
            outcome.sent += start - first
            count = end - start
        # (a burst cut short by the error counts whole: sendmmsg says only that)
        outcome.unsent += count
        outage.refused(count, err.errno, time.monotonic(), sends.peer)
    return start, count, due


def _wait_until(due: float, now: float) -> float:
    """Sleep until ``due``; after a long stall make up at most CATCH_UP_S (a bigger
    burst would overflow the link's queue and turn a stall into losses)."""
    ahead = due - now
    if ahead > 0:
        time.sleep(ahead)
    elif ahead < -CATCH_UP_S:
        due = now - CATCH_UP_S
    return due
