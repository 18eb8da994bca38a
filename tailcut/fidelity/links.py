"""Did each shaped link send at its rate while it had packets to send?

Mininet-HiFi's test of an emulation: a link with a backlog must put a packet on the
wire every transmission time; when the host cannot keep up, the link runs slower than
configured and the run measured the host. tailcut samples, every SAMPLE_S, the root
HTB qdisc of every shaped link end (one netlink dump per namespace): the bytes it has
dequeued (sent) and the bytes waiting in it (backlog). Over an interval that started
with B bytes waiting, a link of rate R running as configured sends at least
min(B, R * dt) (it is busy until that is gone, whatever else arrives), so per end

    drain = sum(min(sent, expected)) / sum(expected),  expected = min(B, R * dt)

over the intervals that started backlogged: 1.0 when the link always drained what it
held at its rate, lower when it stalled. That holds whatever the traffic (the verdict
judges it), but a queue that drains well within an interval (a sender's socket buffer
is about all a UDP flow queues) hides a link at half its rate. `busy_rate`, the median
over the intervals that began and ended backlogged of what the link sent as a share of
its rate, sees that one, but also reads low where a bursty queue emptied between two
samples (a PS's port at 100 Mbit/s read 0.63 on a quiet host): evidence, not judged. It reads only counters the kernel keeps, so
it costs the link nothing; the sampling itself is kept under ~2% of one core.

Under netem, packets on their delay sit in the tree too without waiting for the
rate: the netem qdisc's own backlog (less its child queue's) is not counted as waiting.
"""

from __future__ import annotations

import os
import socket
import statistics
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from tailcut.errors import NetError
from tailcut.net import rtnl, shaping

SAMPLE_S = 0.05         # between samples, at the least
MAX_SAMPLING_SHARE = 0.02   # of one core: the interval grows on a large network
RTM_GETQDISC = 38
TC_H_ROOT = 0xFFFFFFFF
TCA_KIND, TCA_STATS2 = 1, 7
TCA_STATS_BASIC, TCA_STATS_QUEUE = 1, 3


@dataclass(frozen=True)
class Counters:
    sent_bytes: int
    waiting_bytes: int


def dump(sock: socket.socket) -> dict[int, Counters]:
    """Per interface of the socket's namespace with an HTB root: its counters."""
    sock.sendall(struct.pack("=IHHII", 36, RTM_GETQDISC, rtnl.NLM_F_REQUEST | rtnl.NLM_F_DUMP,
                             1, 0) + struct.pack("=BxxxiIII", socket.AF_UNSPEC, 0, 0, 0, 0))
    roots: dict[int, tuple[int, int]] = {}
    netem_backlog: dict[int, int] = {}
    child_backlog: dict[int, int] = {}
    while True:
        data = sock.recv(1 << 20)
        offset = 0
        while offset + 16 <= len(data):
            length, kind, _, _, _ = struct.unpack_from("=IHHII", data, offset)
            if kind == rtnl.NLMSG_DONE:
                return {i: Counters(sent, backlog - netem_backlog.get(i, 0)
                                    + child_backlog.get(i, 0))
                        for i, (sent, backlog) in roots.items()}
            if kind == rtnl.NLMSG_ERROR:
                code, = struct.unpack_from("=i", data, offset + 16)
                raise OSError(-code, f"listing qdiscs: {os.strerror(-code)}")
            _, index, _, parent, _ = struct.unpack_from("=BxxxiIII", data, offset + 16)
            attrs = rtnl.parse_attrs(data, offset + 36, offset + length)
            qkind = attrs.get(TCA_KIND, b"").rstrip(b"\0")
            stats = rtnl.parse_attrs(attrs.get(TCA_STATS2, b""), 0, len(attrs.get(TCA_STATS2, b"")))
            basic, queue = stats.get(TCA_STATS_BASIC), stats.get(TCA_STATS_QUEUE)
            backlog = struct.unpack_from("=I", queue, 4)[0] if queue else 0
            if parent == TC_H_ROOT and qkind == b"htb" and basic:
                roots[index] = (struct.unpack_from("=Q", basic, 0)[0], backlog)
            elif qkind == b"netem":
                netem_backlog[index] = netem_backlog.get(index, 0) + backlog
            elif parent == shaping.NETEM_CLASS:   # netem's child queue
                child_backlog[index] = child_backlog.get(index, 0) + backlog
            offset += (length + 3) & ~3


@dataclass
class EndTally:
    """One link end's intervals."""

    rate_bit: int
    intervals: int = 0
    elapsed_s: float = 0.0
    backlogged: int = 0          # intervals that started with bytes waiting
    expected_bytes: float = 0.0
    drained_bytes: float = 0.0
    sent_bytes: int = 0
    # sent / (rate * dt) of each interval that began and ended with bytes waiting
    busy_ratios: list[float] = field(default_factory=list)

    def add(self, before: Counters, after: Counters, dt: float) -> None:
        sent = after.sent_bytes - before.sent_bytes
        self.intervals += 1
        self.elapsed_s += dt
        self.sent_bytes += sent
        if before.waiting_bytes > 0:
            expected = min(before.waiting_bytes, self.rate_bit / 8 * dt)
            self.backlogged += 1
            self.expected_bytes += expected
            self.drained_bytes += min(sent, expected)
            if after.waiting_bytes > 0:
                self.busy_ratios.append(sent / (self.rate_bit / 8 * dt))

    def summary(self) -> dict[str, Any]:
        drain = (self.drained_bytes / self.expected_bytes if self.expected_bytes else None)
        return {"rate_bit": self.rate_bit, "backlogged": self.backlogged,
                "backlogged_share": round(self.backlogged / self.intervals, 3)
                if self.intervals else 0.0,
                "drain": None if drain is None else round(drain, 3),
                "busy_intervals": len(self.busy_ratios),
                "busy_rate": round(statistics.median(self.busy_ratios), 3)
                if self.busy_ratios else None,
                "sent_bytes": self.sent_bytes,
                # what it sent as a share of what its rate allows over the window
                "utilization": round(self.sent_bytes * 8 / (self.rate_bit * self.elapsed_s),
                                     3) if self.elapsed_s else 0.0}


@dataclass
class Sampler:
    """Samples `ends` ("namespace/ifname" -> configured rate in bit/s) from `start` to
    `stop` in a thread of its own; `every_second` is called about once a second from
    that thread (the process tally's reading rides along)."""

    ends: dict[str, int]
    every_second: Optional[Callable[[], None]] = None
    tallies: dict[str, EndTally] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    samples: int = 0
    interval_s: float = SAMPLE_S
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fidelity-sampler",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return {"ends": {end: t.summary() for end, t in sorted(self.tallies.items())},
                "samples": self.samples, "interval_s": round(self.interval_s, 3),
                "errors": self.errors[:3]}

    def _run(self) -> None:
        socks: dict[str, socket.socket] = {}
        index: dict[str, dict[int, str]] = {}   # ns -> ifindex -> end
        try:
            for end, rate in self.ends.items():
                ns, _, ifname = end.rpartition("/")
                try:
                    if ns not in socks:
                        socks[ns] = rtnl.socket_in(ns)
                    index.setdefault(ns, {})[rtnl.ifindex(socks[ns], ifname)] = end
                    self.tallies[end] = EndTally(rate)
                except (OSError, NetError) as err:
                    self.errors.append(f"{end}: {err}")
            last: dict[str, Counters] = {}
            last_at = time.monotonic()
            next_second = last_at + 1.0
            while True:
                began = time.monotonic()
                now = self._read(socks, index)
                at = time.monotonic()
                for end, counters in now.items():
                    if end in last:
                        self.tallies[end].add(last[end], counters, at - last_at)
                last, last_at = now, at
                self.samples += 1
                if self.every_second is not None and at >= next_second:
                    self.every_second()
                    next_second = at + 1.0
                cost = time.monotonic() - began
                self.interval_s = max(SAMPLE_S, cost / MAX_SAMPLING_SHARE)
                if self._stop.wait(self.interval_s):
                    break
        finally:
            for sock in socks.values():
                sock.close()

    def _read(self, socks: dict[str, socket.socket],
              index: dict[str, dict[int, str]]) -> dict[str, Counters]:
        out: dict[str, Counters] = {}
        for ns, sock in socks.items():
            try:
                found = dump(sock)
            except OSError as err:   # a namespace going away at the end of a run
                if len(self.errors) < 10:
                    self.errors.append(f"{ns}: {err}")
                continue
            for ifindex, end in index[ns].items():
                if ifindex in found:
                    out[end] = found[ifindex]
        return out

