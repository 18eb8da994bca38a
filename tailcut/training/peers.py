"""Who is on the other end of a connection: HELLO role codes and the names logs use.

A connecting role says HELLO with its role code in the ``iteration`` field and its
index in ``sender``. Code 0 is a worker, so a HELLO from an older worker (which
sends iteration 0) still reads as a worker::

    code 0 worker-<i>      pulls from every shard; pushes to them or to its aggregator
    code 1 aggregator-<i>  pushes its group's summed update to every shard
    code 2 replica-0       the PS replica, connected to the primary PS
    code 3 ps-<i>          shard i > 0, connected to shard 0 (evaluation, stop)
"""

from __future__ import annotations

import time

from tailcut import errors
from tailcut.transports import base
from tailcut.transports.base import Kind, Message

WORKER, AGGREGATOR, REPLICA, SHARD = 0, 1, 2, 3
_NAMES = {WORKER: "worker", AGGREGATOR: "aggregator", REPLICA: "replica", SHARD: "ps"}


def name(code: int, index: int) -> str:
    """The pod-style name of a peer: ``worker-3``, ``aggregator-0``, ``ps-1``."""
    return f"{_NAMES[code]}-{index}"


def hello(
    transport: base.Transport, host: str, port: int, code: int, index: int, deadline: float
) -> base.Connection:
    """Connect to a server role and introduce ourselves."""
    conn = transport.connect(host, port, left(deadline))
    conn.send(Message(Kind.HELLO, code, index), left(deadline))
    return conn


def accept(
    transport: base.Transport, conns: list[base.Connection], expected: set[str], deadline: float
) -> dict[str, base.Connection]:
    """Read every connection's HELLO; return them by peer name (must be ``expected``)."""
    hellos = transport.gather(conns, left(deadline))
    by_name: dict[str, base.Connection] = {}
    for conn, msg in zip(conns, hellos, strict=True):
        if msg.kind != Kind.HELLO:
            raise errors.RunError(f"{conn.peer} sent {msg.kind.name} before HELLO")
        if msg.iteration not in _NAMES:
            raise errors.RunError(
                f"{conn.peer} says HELLO with role code {msg.iteration}; known: {sorted(_NAMES)}"
            )
        who = name(msg.iteration, msg.sender)
        if who not in expected:
            raise errors.RunError(
                f"{conn.peer} says it is {who}; expected {', '.join(sorted(expected))}"
            )
        if who in by_name:
            raise errors.RunError(
                f"two peers say they are {who}: {by_name[who].peer} and {conn.peer}"
            )
        by_name[who] = conn
        # errors then name the peer: "worker 1 (127.0.0.1:5000)"
        conn.peer = f"{who.replace('-', ' ')} ({conn.peer})"
        conn.hello = msg  # type: ignore[attr-defined]
    return by_name


def left(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.0)
