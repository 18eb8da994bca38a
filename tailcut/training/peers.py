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

import errno
import time

from tailcut import errors
from tailcut.transports import base
from tailcut.transports.base import Kind, Message

WORKER, AGGREGATOR, REPLICA, SHARD = 0, 1, 2, 3
_NAMES = {WORKER: "worker", AGGREGATOR: "aggregator", REPLICA: "replica", SHARD: "ps"}


def name(code: int, index: int) -> str:
    """The pod-style name of a peer: ``worker-3``, ``aggregator-0``, ``ps-1``."""
    return f"{_NAMES[code]}-{index}"


# How long a role waits for its own address to come back before it gives up
# listening. On Kubernetes a node agent that stops removes its pods' tc0 (and with it
# their address) and its successor adds it again: the outage docs/kubernetes.md
# measures is tens of seconds on a busy node, under the 120 s the pod entrypoint
# waits for the address the first time.
ADDRESS_WAIT_S = 120.0
ADDRESS_POLL_S = 0.2


def listen(
    transport: base.Transport, host: str, port: int, count: int, deadline: float,
    address_wait_s: float = ADDRESS_WAIT_S,
) -> list[base.Connection]:
    """``transport.listen`` on our own endpoint, retried while ``host`` is not an
    address of ours (EADDRNOTAVAIL), for at most ``address_wait_s``: the address can
    go between the pod entrypoint seeing it and the role binding (an agent restart).
    Any other failure, or the address still missing, raises."""
    started = time.monotonic()
    gives_up = started + min(address_wait_s, left(deadline))
    while True:
        try:
            return transport.listen(host, port, count, left(deadline))
        except base.TransportError as err:
            if not _address_missing(err):
                raise
            if time.monotonic() >= gives_up:
                raise errors.RunError(
                    f"cannot listen on {host}:{port}: {host} is not an address of this "
                    f"host or pod, and did not come back in "
                    f"{time.monotonic() - started:.1f} s of waiting (on "
                    "Kubernetes the tailcut node agent adds it as tc0: is the agent "
                    "running on this pod's node, and what does its log say?)"
                ) from err
        time.sleep(ADDRESS_POLL_S)


def _address_missing(err: BaseException | None) -> bool:
    """Whether `err`, or what caused it, is a bind to an address we do not have."""
    while err is not None:
        if isinstance(err, OSError) and err.errno == errno.EADDRNOTAVAIL:
            return True
        err = err.__cause__
    return False


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
