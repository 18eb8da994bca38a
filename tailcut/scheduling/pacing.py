"""Pace a TCP socket to a rate: SO_MAX_PACING_RATE, the kernel's per-socket cap.

Setting SO_MAX_PACING_RATE turns on TCP's internal pacing (an hrtimer per socket,
since Linux 4.13), so it needs no fq qdisc, which this kernel lacks
(/work/shared/PLATFORM.md); the congestion control (BBR by default here) then paces
at min(its own rate, the cap). The rate counts TCP payload bytes per second, not
frames: tailcut.scheduling.madd turns link bandwidths into payload rates.

Chosen over an HTB class per flow because it needs nothing in the network: no class
per flow on every hop, no classifier to map a connection to its class, and a new rate
is one setsockopt from the sender when a coflow's rates change.
"""

from __future__ import annotations

import socket
import struct

from tailcut.transports import tcp

SO_MAX_PACING_RATE = tcp.SO_MAX_PACING_RATE
UNLIMITED = 0xFFFFFFFF  # ~0U: the kernel's "no cap"


def set_rate(sock: socket.socket, bytes_per_s: float | None) -> None:
    """Cap ``sock``'s sending rate at ``bytes_per_s`` payload bytes per second (None:
    no cap). Rates are whole bytes/s, at least 1."""
    tcp.set_max_pacing_rate(sock, bytes_per_s)


def rate_of(sock: socket.socket) -> int | None:
    """The cap set on ``sock`` (bytes/s), or None if it has none."""
    (value,) = struct.unpack("I", sock.getsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, 4))
    return None if value == UNLIMITED else int(value)
