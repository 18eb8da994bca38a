"""How the messages one transport sends at once share its own link: shortest remaining
first, work-conserving (as a Homa sender orders its messages).

The message with the fewest bytes left to send goes first, at the whole link or at
its grant (congestion.py) if that is lower; what its grant leaves of the link goes to
the next message, and so on; a message left with nothing waits for its turn. Ties
go to the message that started first. A pass of retransmissions (a few packets) thus
goes ahead of a whole message, and a PS's replies to N workers over a link that each
of them can take whole go out one after the other at the full link rather than
N-way split: the first worker has its parameters after 1/N of the time and starts
its next iteration, and the last has them when it would have with an equal split.
Measured with the quickstart at 200 Mbit/s (bench/bl_conditions.py,
docs/bounded-loss.md#sharing-the-links): an equal split made every worker wait for
the slowest reply, and bounded loss was then slower than TCP, whose flows do not
share a link evenly either.

With no link rate (an unshaped interface and no ``rateMbit``) there is nothing to
order: every message goes as fast as its grant, or the CPU, allows.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from tailcut.transports.congestion import MIN_RATE_BIT

GrantOf = Callable[[], "float | None"]


class Turn:
    """One pass of one message in its sender's schedule (sender.pace asks it for its
    rate after every burst)."""

    def __init__(self, schedule: LinkSchedule, left_bytes: int, grant_of: GrantOf,
                 arrival: int) -> None:
        self._schedule = schedule
        self.left_bytes = left_bytes
        self.grant_of = grant_of
        self.arrival = arrival

    def rate_bit(self) -> float | None:
        """The rate to pace at now; 0.0: another message goes first (wait()); None: as
        fast as the CPU allows."""
        return self._schedule.rate_bit(self)

    def sent(self, left_bytes: int) -> None:
        """A burst went out; ``left_bytes`` of the pass are still to send."""
        with self._schedule.changes:
            self.left_bytes = left_bytes

    def wait(self, timeout_s: float) -> None:
        """Block until the schedule may have given this pass a rate, at most
        ``timeout_s``."""
        self._schedule.wait(self, timeout_s)


class LinkSchedule:
    """The passes one transport is sending at once, over a link of ``link_bit``
    (None: unshaped)."""

    def __init__(self, link_bit: float | None) -> None:
        self.link_bit = link_bit
        self.changes = threading.Condition()
        self._turns: list[Turn] = []
        self._arrivals = itertools.count()

    def enter(self, left_bytes: int, grant_of: GrantOf) -> Turn:
        """A pass of ``left_bytes`` (wire bytes) begins; ``grant_of`` is its receiver's
        latest grant (None: none yet)."""
        with self.changes:
            turn = Turn(self, left_bytes, grant_of, next(self._arrivals))
            self._turns.append(turn)
            return turn

    def leave(self, turn: Turn) -> None:
        """The pass is over (sent, stopped at DONE or failed): the next one goes."""
        with self.changes:
            self._turns.remove(turn)
            self.changes.notify_all()

    def changed(self) -> None:
        """A grant moved or a message is DONE: the waiting passes look again."""
        with self.changes:
            self.changes.notify_all()

    def rate_bit(self, turn: Turn) -> float | None:
        with self.changes:
            return self._rate_bit(turn)

    def wait(self, turn: Turn, timeout_s: float) -> None:
        with self.changes:
            if self._rate_bit(turn) == 0.0:
                self.changes.wait(timeout_s)

    @property
    def sending(self) -> int:
        with self.changes:
            return len(self._turns)

    def _rate_bit(self, turn: Turn) -> float | None:
        if self.link_bit is None:
            grant = turn.grant_of()
            return None if grant is None else max(MIN_RATE_BIT, grant)
        left = self.link_bit
        for other in sorted(self._turns, key=lambda t: (t.left_bytes, t.arrival)):
            grant = other.grant_of()
            take = left if grant is None else min(left, max(MIN_RATE_BIT, grant))
            if take < MIN_RATE_BIT:
                return 0.0   # the link is taken by the passes ahead
            if other is turn:
                return take
            left -= take
        raise ValueError("a pass not in the schedule (left already)")
