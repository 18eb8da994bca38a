"""Inbox: the software receiving queue of a role, fed by one reader thread per connection
(or, for a connection that hands over what it receives, by the connection's own threads).

Every message read off a connection is put in one queue together with the
connection it came from; ``received_at_ns`` (stamped by the transport when the
message was complete) is when it entered the queue, so the time until a role
takes it out is the IMC'20 paper's queueing delay (PS_queue at a server, W_queue
at a worker). The ordering policy decides which waiting message is taken first:

- ``fifo``: in order of arrival;
- ``stf``: shortest transfer first (MLfabric), fewest bytes first, then arrival.

A connection that fails yields one event carrying the error and its reader stops.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tailcut.transports import base
from tailcut.transports.base import Message

ORDERINGS = ("fifo", "stf")


@dataclass
class Event:
    """One message (or a connection's failure) from connection ``source``."""

    source: int
    msg: Message | None
    error: base.TransportError | None = None
    arrived_ns: int = 0  # when it entered the queue
    seq: int = 0  # arrival order, breaks ties
    # One part of a message still arriving (``parts``=True below): ``msg.values`` is
    # valid only in ``msg.parts[0]``'s range; the whole message follows as its own event.
    partial: bool = False

    def sort_key(self, ordering: str) -> tuple[int, int]:
        if ordering == "stf" and self.msg is not None:
            return (self.msg.wire_bytes, self.seq)
        return (0, self.seq)


class Inbox:
    """One queue for many connections; ``take`` applies the ordering policy."""

    def __init__(self, conns: Sequence[base.Connection], ordering: str = "fifo",
                 parts: bool = False) -> None:
        """``parts``: also queue each part of a message sent in parts as it arrives (a
        ``partial`` event, for layer-wise roles), on connections that can report them."""
        if ordering not in ORDERINGS:
            raise ValueError(f"ordering={ordering!r}: supported: {', '.join(ORDERINGS)}")
        self.conns = list(conns)
        if parts:
            for i, conn in enumerate(self.conns):
                if hasattr(conn, "on_part"):
                    conn.on_part = self._part_reporter(i)
        self.ordering = ordering
        self._queue: queue.Queue[Event] = queue.Queue()
        self._pending: list[Event] = []
        self._seq = 0
        self._lock = threading.Lock()
        for i, conn in enumerate(self.conns):
            attach = getattr(conn, "attach", None)
            if attach is not None:  # the connection hands over what it receives itself
                attach(self._sink(i))
            else:
                threading.Thread(
                    target=self._read, args=(i, conn), daemon=True, name=f"inbox-{i}"
                ).start()

    def _read(self, source: int, conn: base.Connection) -> None:
        while True:
            try:
                msg = conn.recv(None)
            except base.TransportError as err:
                self._put(Event(source, None, err, time.time_ns()))
                return
            except Exception as err:  # e.g. the socket was closed under us at the end
                self._put(Event(source, None, base.PeerClosed(str(err)), time.time_ns()))
                return
            self._put(Event(source, msg, None, msg.received_at_ns or time.time_ns()))
            if msg.kind == base.Kind.STOP:
                return

    def _sink(self, source: int) -> Callable[[Message | None, BaseException | None], bool]:
        """What ``_read`` does with each message or failure, for a connection that
        hands them over as they come in (datagram.DatagramConnection.attach)."""
        def take(msg: Message | None, error: BaseException | None) -> bool:
            if msg is None:
                err = error if isinstance(error, base.TransportError) else \
                    base.PeerClosed(str(error))
                self._put(Event(source, None, err, time.time_ns()))
                return False
            self._put(Event(source, msg, None, msg.received_at_ns or time.time_ns()))
            return msg.kind != base.Kind.STOP
        return take

    def _part_reporter(self, source: int) -> Callable[[Message], None]:
        def report(msg: Message) -> None:
            self._put(Event(source, msg, None, msg.received_at_ns, partial=True))
        return report

    def _put(self, event: Event) -> None:
        with self._lock:
            self._seq += 1
            event.seq = self._seq
        self._queue.put(event)

    def _drain(self) -> None:
        while True:
            try:
                self._pending.append(self._queue.get_nowait())
            except queue.Empty:
                return

    def take(
        self, timeout_s: float | None, match: Callable[[Event], bool] | None = None
    ) -> Event:
        """The next event by the ordering policy (only those ``match`` accepts, if given).

        Raises TransportTimeout when nothing acceptable arrives in ``timeout_s``.
        """
        deadline = base.deadline_after(timeout_s)
        while True:
            self._drain()
            ready = [e for e in self._pending if match is None or match(e)]
            if ready:
                best = min(ready, key=lambda e: e.sort_key(self.ordering))
                self._pending.remove(best)
                return best
            left = base.remaining(deadline)
            if left is not None and left <= 0:
                raise base.TransportTimeout("nothing arrived in time")
            try:
                self._pending.append(self._queue.get(timeout=left))
            except queue.Empty:
                raise base.TransportTimeout("nothing arrived in time") from None

    def stop_within(self, timeout_s: float) -> Event | None:
        """The next STOP from any connection if one arrives within ``timeout_s``, else
        None; other events stay queued. A peer told STOP closes at once, so its close
        can reach a role before the STOP meant for that role does."""
        try:
            return self.take(timeout_s, match=lambda e: e.msg is not None
                             and e.msg.kind == base.Kind.STOP)
        except base.TransportTimeout:
            return None
