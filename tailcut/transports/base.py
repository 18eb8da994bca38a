"""The transport interface: Message, Connection and Transport, shared by every transport.

A job switches transport (tcp, udp, bounded-loss, app-drop) by changing one spec
line, so the PS and workers only ever see these three types:

- ``Message``: one PUSH (gradient), PARAMS (model), HELLO or STOP, with the float32
  vector and, for lossy transports, a mask of the coordinates that arrived.
- ``Connection``: one peer; ``send`` a message, ``recv`` the next one.
- ``Transport``: ``listen`` for a known number of peers (the PS) or ``connect``
  to one (a worker), and ``gather`` one message from each of several connections.

Errors, under ``tailcut.errors.TailcutError``::

    TransportError           a transport could not deliver or accept a message
    ├── ProtocolError        the peer's bytes do not follow the framing (says what)
    ├── PeerClosed           the peer closed the connection or went away
    │   └── ClosedMidFrame   ... in the middle of a frame (also a ProtocolError)
    └── TransportTimeout     nothing arrived (or nobody connected) in time
"""

from __future__ import annotations

import abc
import enum
import errno
import socket
import struct
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType

import numpy as np

from tailcut import errors

# Sender id the parameter server uses; workers use their index 0..N-1.
PS_SENDER = -1
# connect_tcp retries only these: the server may not be listening yet, or its netns
# link may not be up yet. Anything else (a bad host name) fails at once.
TRANSIENT_CONNECT_ERRNOS = frozenset(
    {errno.ECONNREFUSED, errno.ECONNRESET, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT}
)
CONNECT_RETRY_S = 0.1
# One connect attempt's longest wait. Not 1 s: that is the kernel's first SYN
# retransmission (and a server's SYN-ACK one), so on a lossy link an attempt could time
# out just as its handshake completed, and its close reached a server that had
# accepted it: the PS failed the job on "closed the connection" (2 of 10 runs at 1%
# loss, 200 Mbit/s). 1.5 s is half a second from each retransmission (1, 2, 3 s).
CONNECT_ATTEMPT_S = 1.5
# A name not resolvable yet: on Kubernetes, ps-0.<job>'s record appears in the job's
# headless service only once the PS pod has an address, and a worker may start first.
TRANSIENT_RESOLVE_ERRORS = frozenset({socket.EAI_NONAME, socket.EAI_AGAIN})


class TransportError(errors.TailcutError):
    """A transport failed to deliver or accept a message."""


class ProtocolError(TransportError):
    """The peer sent bytes that do not follow the framing; the message says which field."""


class PeerClosed(TransportError):
    """The peer closed the connection or is gone."""


class ClosedMidFrame(PeerClosed, ProtocolError):
    """The peer closed the connection in the middle of a frame: it went away (a
    PeerClosed, for the role that reports it) and the frame is cut (a ProtocolError)."""


class TransportTimeout(TransportError, TimeoutError):
    """No message arrived, or no peer connected, within the timeout."""


class Kind(enum.IntEnum):
    """What a message carries. Values are on the wire: never renumber."""

    HELLO = 1  # worker -> PS after connecting: "I am worker <sender>"
    PUSH = 2  # worker -> PS: the gradient of one minibatch
    PARAMS = 3  # PS -> worker: the model for the next iteration
    STOP = 4  # PS -> worker: training is over, exit cleanly
    PULL = 5  # worker -> PS: "send me the model for iteration <iteration>" (no values)
    ACK = 6  # PS -> worker: the PUSH for <iteration> was applied (no values)


@dataclass
class Message:
    """One message between PS and worker.

    ``mask`` is None when every coordinate arrived; otherwise ``mask[i]`` is True
    when ``values[i]`` arrived (a missing coordinate's value is meaningless).
    ``sent_at_ns`` is the sender's ``time.time_ns()`` when it started sending; leave
    it 0 and ``Connection.send`` stamps it. All pods share one host clock, so the
    receiver computes completion time as ``received_at_ns - sent_at_ns``.
    ``received_at_ns`` and ``wire_bytes`` are set by the receiving transport.
    """

    kind: Kind
    iteration: int
    sender: int
    values: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    mask: np.ndarray | None = None
    sent_at_ns: int = 0
    received_at_ns: int = 0
    wire_bytes: int = 0
    # Set by a transport that delivered the message in parts (CadentFlow: one frame
    # per tensor, tailcut.transports.tcp): each part's range and timing.
    parts: list[Part] | None = None
    # Bounded loss: how many NACK rounds (passes of retransmissions) came before the
    # message was delivered; 0 over the other transports.
    repairs: int = 0

    @property
    def completion_s(self) -> float:
        """Seconds from the start of sending to the end of receiving."""
        return (self.received_at_ns - self.sent_at_ns) / 1e9

    @property
    def missing(self) -> int:
        """Number of coordinates that did not arrive."""
        return 0 if self.mask is None else int(self.mask.size - np.count_nonzero(self.mask))


@dataclass(frozen=True)
class Cut:
    """One tensor of a message sent as its own part: ``values[offset:offset+size]``,
    tagged with priority ``level`` (0 is most urgent; None: untagged)."""

    offset: int
    size: int
    level: int | None = None


@dataclass(frozen=True)
class Part:
    """One received part of a message: its range, level and completion stamps."""

    offset: int
    size: int
    level: int | None
    sent_at_ns: int
    received_at_ns: int

    @property
    def completion_s(self) -> float:
        return (self.received_at_ns - self.sent_at_ns) / 1e9


class Connection(abc.ABC):
    """A link to one peer over some transport."""

    peer: str = "?"  # "host:port", for error messages

    @abc.abstractmethod
    def send(self, msg: Message, timeout_s: float | None = None) -> None:
        """Send ``msg`` (a lossy transport may deliver part); raise TransportTimeout if slow."""

    @abc.abstractmethod
    def recv(self, timeout_s: float | None = None) -> Message:
        """Block for the next message; raise TransportTimeout after ``timeout_s``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection; safe to call twice."""

    def __enter__(self) -> Connection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Transport(abc.ABC):
    """Makes connections; one instance per process."""

    name: str = "?"

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0

    @abc.abstractmethod
    def listen(self, host: str, port: int, count: int, timeout_s: float) -> list[Connection]:
        """Accept exactly ``count`` peers on ``host:port`` within ``timeout_s`` seconds."""

    @abc.abstractmethod
    def connect(self, host: str, port: int, timeout_s: float) -> Connection:
        """Connect to ``host:port``, retrying until ``timeout_s`` (the peer may start later)."""

    def gather(self, conns: Sequence[Connection], timeout_s: float | None) -> list[Message]:
        """Receive one message from each connection, concurrently, in ``conns`` order.

        Concurrent so that each message's completion time is its own, not the time
        spent waiting for the receiver to finish reading the others. The default
        uses one thread per connection (socket reads release the GIL); a transport
        with one shared socket can override it.
        """
        if self._pool is None or self._pool_size < len(conns):
            self.close()
            self._pool_size = max(len(conns), 1)
            self._pool = ThreadPoolExecutor(self._pool_size, thread_name_prefix="gather")
        futures = [self._pool.submit(c.recv, timeout_s) for c in conns]
        # Wait for all before raising, so no thread is left reading a socket the
        # caller is about to close.
        results: list[Message] = []
        first_error: Exception | None = None
        for fut in futures:
            try:
                results.append(fut.result())
            except Exception as err:  # re-raised below, once every thread is done
                first_error = first_error or err
        if first_error is not None:
            raise first_error
        return results

    def close(self) -> None:
        """Stop helper threads; connections are closed by their owners."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


def deadline_after(timeout_s: float | None) -> float | None:
    """A ``time.monotonic()`` deadline, or None for no timeout."""
    return None if timeout_s is None else time.monotonic() + timeout_s


def remaining(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (never negative), or None for no deadline."""
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


def connect_tcp(host: str, port: int, timeout_s: float,
                retry_any_error: bool = False) -> socket.socket:
    """A TCP socket connected to ``host:port``, retrying every CONNECT_RETRY_S until
    ``timeout_s`` (the server, or its name, may appear later) on a transient error, or
    on any OSError with ``retry_any_error``. Others raise TransportError, running out
    of time TransportTimeout."""
    deadline = deadline_after(timeout_s)
    last: OSError | None = None
    while True:
        left = remaining(deadline) or 0.0
        try:
            sock = socket.create_connection((host, port),
                                            timeout=max(min(left, CONNECT_ATTEMPT_S), 0.01))
        except TimeoutError as err:
            last = err
        except OSError as err:
            transient = (err.errno in TRANSIENT_RESOLVE_ERRORS
                         if isinstance(err, socket.gaierror)
                         else err.errno in TRANSIENT_CONNECT_ERRNOS)
            if not retry_any_error and not transient:
                raise TransportError(f"cannot connect to {host}:{port}: {err}") from err
            last = err
        else:
            if sock.getsockname() != sock.getpeername():
                return sock
            # Nobody listens yet and the kernel gave us `port` as our own source
            # port: TCP's simultaneous open connected the socket to itself. Reset it
            # (linger 0) so no TIME_WAIT holds the port the server is about to use.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
            last = OSError(f"connected to itself on port {port}")
        if (remaining(deadline) or 0.0) <= CONNECT_RETRY_S:
            raise TransportTimeout(
                f"could not connect to {host}:{port} within {timeout_s} s (last error: "
                f"{last}); is the parameter server running and reachable?"
            )
        time.sleep(CONNECT_RETRY_S)
