"""Receiver-driven rates for the datagram transports: a sender takes the link when it is
free and shares it when it is not.

A receiver knows the rate of its own link (the HTB class on its interface: the
rack's port towards it is shaped the same) and every message converging on it (begun
and not finished). Whenever that set changes it grants each of their senders an equal
share in a GRANT frame (control.py), as Homa, NDP and EQDS let the receiver schedule
its own downlink. A sender paces each message at the smaller of the last grant and
what its own link has for it (srpt.py: shortest remaining first), so:

- one sender alone, to one receiver: the whole link (no static ``rate / workers``);
- N workers pushing into the PS at once (BSP incast): each rate / N;
- the PS replying to N workers: one after the other at its whole link, or several at
  once where their grants leave room.

What is shared out is the link less the other traffic arriving on it (background
flows, another job): the receiver reads its interface's byte counter
(/proc/net/dev, per network namespace, held open) every SAMPLE_S while messages are
coming in (every 50 ms otherwise), subtracts its own datagrams, and grants what is
left, but never less than TCP's per-flow fairness would leave the job: with n
messages converging and the other traffic counted as one more flow (its byte counter
cannot tell how many it is), n / (n + 1) of the link. So background load is not run
over (it keeps at least a flow's share, and all it leaves), nor does it take the
job's share by having started first; a shallow switch buffer sees little more than
the link can carry.

Before its first grant a message starts at the lowest grant the previous message on
the same connection had (a BSP push starts at its last iteration's share), or at its
own link's rate on a connection's first message. What the estimate misses (a burst
of other traffic within a sample, congestion upstream on an uplink) ends as queueing
or as drops, and the p floor (NACK and retransmit) still holds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Protocol, TypeVar

MIN_RATE_BIT = 1e6  # no grant paces a sender below 1 Mbit/s (a hostile or stale GRANT)
MAX_GRANT_KBIT = 0xFFFF_FFFF  # the frame's count field: 4.3 Tbit/s
REGRANT_RATIO = 0.02  # shares closer than 2% to the last grant are not sent again
POOL_STEP = 0.05  # the pool is re-shared once the other traffic moves it by 5% of the link
SAMPLE_S = 0.005  # how often the receiver reads its link's byte counter
SMOOTH_S = 0.02  # time constant of the other traffic's moving average
WIRE_OVERHEAD_BYTES = 14 + 20 + 8  # Ethernet, IP and UDP headers of each packet counted
READ_BYTES = 1 << 16  # /proc/net/dev is read this much at a time


class Granted(Protocol):
    """What a receiver keeps per message being received: the last grant it sent."""

    granted_kbit: int


G = TypeVar("G", bound=Granted)


def shares(link_bit: float | None, active: Sequence[G]) -> list[tuple[G, int]]:
    """The (message, kbit/s) grants to send: an equal share of ``link_bit`` for every
    message in ``active`` whose last grant differs by more than REGRANT_RATIO. Each
    returned message's ``granted_kbit`` is updated. None (unshaped link): no grants."""
    if link_bit is None or not active:
        return []
    share = min(MAX_GRANT_KBIT, max(1, int(link_bit / len(active) / 1e3)))
    changed = []
    for rx in active:
        if abs(rx.granted_kbit - share) > REGRANT_RATIO * share:
            rx.granted_kbit = share
            changed.append((rx, share))
    return changed


class LinkMonitor:
    """The rate of the traffic other than ours arriving on one interface, from its
    receive byte counter, smoothed over SMOOTH_S."""

    def __init__(self, ifname: str, proc_net_dev: str = "/proc/net/dev") -> None:
        self.ifname = ifname
        self.path = proc_net_dev
        self._smoothed = 0.0  # bit/s, may dip below 0 between samples
        self._last: tuple[float, int] | None = None  # (time, interface bytes)
        self._ours = 0  # our datagram bytes since the last sample
        self._fd: int | None = None  # the counter file, held open: pread re-reads it

    @property
    def other_bit(self) -> float:
        """The smoothed other traffic, bit/s."""
        return max(0.0, self._smoothed)

    def ours(self, datagram_bytes: int, packets: int) -> None:
        """Count what of ours arrived: its datagrams' bytes, in ``packets`` as the
        interface counted them, each with one set of headers (a UDP GSO message that
        came whole is one packet: its datagrams share its headers)."""
        self._ours += datagram_bytes + packets * WIRE_OVERHEAD_BYTES

    def sample(self, now: float | None = None) -> float | None:
        """Read the counter; the smoothed other traffic in bit/s (None: unreadable)."""
        now = time.monotonic() if now is None else now
        total = self._read()
        if total is None:
            return None
        last, self._last = self._last, (now, total)
        ours, self._ours = self._ours, 0
        if last is None or now <= last[0]:
            return self.other_bit
        dt = now - last[0]
        # Not clamped per sample: datagrams counted by the interface but not read yet
        # make one sample high and the next low, and only their average is right.
        other = 8 * (total - last[1] - ours) / dt
        weight = min(1.0, dt / SMOOTH_S)
        self._smoothed += weight * (other - self._smoothed)
        return self.other_bit

    def _read(self) -> int | None:
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            chunks = [os.pread(self._fd, READ_BYTES, 0)]
            while len(chunks[-1]) == READ_BYTES:  # a namespace with many interfaces
                chunks.append(os.pread(self._fd, READ_BYTES, READ_BYTES * len(chunks)))
            for line in b"".join(chunks).splitlines():
                name, _, rest = line.partition(b":")
                if rest and name.strip().decode() == self.ifname:
                    return int(rest.split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def pool(link_bit: float | None, other_bit: float, messages: int) -> float | None:
    """What the receiver shares out among ``messages`` converging on it: its link less
    the other traffic on it, at least the fair share of ``messages`` flows next to one
    other flow."""
    if link_bit is None:
        return None
    if other_bit < POOL_STEP * link_bit:
        # Within the estimate's noise (our datagrams counted by the interface but not
        # read yet): a grant a few Mbit/s short of the link would leave the sender a
        # scrap of it that is no use to anyone (srpt.MIN_LEFTOVER_SHARE).
        return link_bit
    fair = messages / (messages + 1) * link_bit
    return max(fair, link_bit - other_bit)
