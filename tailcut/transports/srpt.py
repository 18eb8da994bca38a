"""How the messages one transport sends at once share its own link: shortest remaining
first, work-conserving (as a Homa sender orders its messages).

The message with the fewest bytes left to send goes first, at the whole link or at
its grant (congestion.py) if that is lower; what its grant leaves of the link goes to
the next message, and so on; a message left with nothing (or a scrap: less than
MIN_LEFTOVER_SHARE of the link) waits for its turn. Ties
go to the message that started first. A pass of retransmissions (a few packets) thus
goes ahead of a whole message, and a PS's replies to N workers over a link that each
of them can take whole go out one after the other at the full link rather than
N-way split: the first worker has its parameters after 1/N of the time and starts
its next iteration, and the last has them when it would have with an equal split
(docs/bounded-loss.md#sharing-the-links has the measurements).

Under CadentFlow (per-tensor priority levels) urgency comes first: the pass whose
next packet is of the most urgent level goes first, and shortest remaining only
among passes at the same level, so every worker's most urgent tensors still leave
before anybody's bulk.

A pass waits no longer than the passes ahead of it should take at their rates (and
OVERDUE_SLACK of that, at least OVERDUE_MIN_S): on two cores shared by several roles
a sender thread often waits for the CPU, and the link would idle behind it. A pass
whose wait ran out is overdue and goes at an equal share of the link next to the
ones ahead (as every pass did before this schedule) until it is first.

With no link rate (an unshaped interface and no ``rateMbit``) there is nothing to
order: every message goes as fast as its grant, or the CPU, allows.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence

from tailcut.transports.congestion import MIN_RATE_BIT

OVERDUE_SLACK = 1.25  # how much longer than their rates say the passes ahead may take
OVERDUE_MIN_S = 0.002
# A scrap of the link that the passes ahead leave (their grants just under the link) is
# not taken: a pass sends a whole burst at once and then sleeps it off at its rate,
# deaf to the link freeing up (22 datagrams at 2.7 Mbit/s: a 0.1 s sleep). It waits
# for its turn instead.
MIN_LEFTOVER_SHARE = 0.1

# The receiver's latest grant of the message, bit/s (None: none yet). Called with the
# schedule's lock held: it must only read.
GrantOf = Callable[[], "float | None"]


class Turn:
    """One pass of one message in its sender's schedule (sender.pace asks it for its
    rate after every burst)."""

    def __init__(self, schedule: LinkSchedule, left_bytes: int, grant_of: GrantOf,
                 arrival: int, levels: Sequence[int] | None) -> None:
        self._schedule = schedule
        self.left_bytes = left_bytes
        self.grant_of = grant_of
        self.arrival = arrival
        self._levels = levels
        self.level = levels[0] if levels else 0
        self.link_was_idle = False  # set by enter(): nothing else was being sent
        self.overdue = False  # its wait ran out: it shares the link with those ahead
        self._due_at: float | None = None  # when it goes overdue if still waiting
        # Called (any thread) when its rate may have changed or its DONE came: a pass
        # paced in compiled code (sender._pace) then stops after its current burst and
        # looks again.
        self.on_change: Callable[[], None] | None = None

    @property
    def alone(self) -> bool:
        """Whether no other pass is being sent: then only a grant or DONE changes this
        one's rate (on_change), and its bursts can be paced without asking after each."""
        return self._schedule.sending == 1

    def rate_bit(self) -> float | None:
        """The rate to pace at now; 0.0: another message goes first (wait()); None: as
        fast as the CPU allows."""
        rate = self._schedule.rate_bit(self)
        if rate != 0.0:
            self._due_at = None  # not waiting: a later wait starts a new spell
        return rate

    def sent(self, left_bytes: int, position: int) -> None:
        """A burst went out; ``left_bytes`` of the pass are still to send, from its
        packet number ``position`` on."""
        with self._schedule.changes:
            self.left_bytes = left_bytes
            if self._levels and position < len(self._levels):
                self.level = self._levels[position]

    def wait(self, timeout_s: float, stop: threading.Event) -> None:
        """Block until the schedule gives this pass a rate or ``stop`` is set (its DONE
        came: LinkSchedule.changed), at most ``timeout_s``."""
        schedule = self._schedule
        with schedule.changes:
            ahead_s = schedule._time_ahead_s(self)
            now = time.monotonic()
            if ahead_s is not None:
                # The deadline is set by the first wait of a spell and kept by the next
                # ones: a wait cut short by timeout_s is not yet overdue.
                if self._due_at is None:
                    self._due_at = now + max(OVERDUE_MIN_S, OVERDUE_SLACK * ahead_s)
                timeout_s = min(timeout_s, max(0.0, self._due_at - now))
            if schedule.changes.wait_for(
                    lambda: stop.is_set() or schedule._rate_bit(self) != 0.0, timeout_s):
                self._due_at = None  # its turn came: a later wait starts a new spell
            elif self._due_at is not None and time.monotonic() >= self._due_at:
                self.overdue = True


class LinkSchedule:
    """The passes one transport is sending at once, over a link of ``link_bit``
    (None: unshaped)."""

    def __init__(self, link_bit: float | None) -> None:
        self.link_bit = link_bit
        # No grant paces below 1 Mbit/s, nor below a slower link's own rate.
        self.floor_bit = MIN_RATE_BIT if link_bit is None else min(MIN_RATE_BIT, link_bit)
        self.changes = threading.Condition()
        self._turns: list[Turn] = []
        self._arrivals = itertools.count()

    def enter(self, left_bytes: int, grant_of: GrantOf,
              levels: Sequence[int] | None = None) -> Turn:
        """A pass of ``left_bytes`` (wire bytes) begins; ``grant_of`` gives its
        receiver's latest grant; ``levels``: each packet's priority level, in the order
        sent (CadentFlow; 0 is the most urgent), or None."""
        with self.changes:
            turn = Turn(self, left_bytes, grant_of, next(self._arrivals), levels)
            turn.link_was_idle = not self._turns
            self._changed()  # the passes already here may now share the link
            self._turns.append(turn)
            return turn

    def leave(self, turn: Turn) -> None:
        """The pass is over (sent, stopped at DONE or failed): the next one goes."""
        with self.changes:
            self._turns.remove(turn)
            self.changes.notify_all()
            self._changed()

    def changed(self) -> None:
        """A grant moved or a message is DONE: the waiting passes look again, and so
        do those being paced in compiled code."""
        with self.changes:
            if len(self._turns) > 1:
                self.changes.notify_all()
            self._changed()

    def _changed(self) -> None:
        for turn in self._turns:
            if turn.on_change is not None:
                turn.on_change()

    def rate_bit(self, turn: Turn) -> float | None:
        with self.changes:
            return self._rate_bit(turn)

    @property
    def sending(self) -> int:
        with self.changes:
            return len(self._turns)

    def _granted(self, turn: Turn, rate_bit: float | None) -> float | None:
        """``rate_bit`` at most the turn's grant (never below the floor)."""
        grant = turn.grant_of()
        if grant is None:
            return rate_bit
        grant = max(self.floor_bit, grant)
        return grant if rate_bit is None else min(rate_bit, grant)

    def _rate_bit(self, turn: Turn) -> float | None:
        if self.link_bit is None:
            return self._granted(turn, None)
        for other, take in self._takes():
            if other is turn:
                if take or not turn.overdue:
                    return take   # 0.0: the link is taken by the passes ahead
                return self._granted(turn, self.link_bit / len(self._turns))
        raise ValueError("a pass not in the schedule (left already)")

    def _takes(self) -> list[tuple[Turn, float]]:
        """Each pass, first to last, with the rate the link has for it (0: none)."""
        assert self.link_bit is not None
        left, takes = self.link_bit, []
        least_leftover = max(self.floor_bit, MIN_LEFTOVER_SHARE * self.link_bit)
        for other in sorted(self._turns, key=lambda t: (t.level, t.left_bytes, t.arrival)):
            take = self._granted(other, left)
            assert take is not None
            leftover = take == left < self.link_bit
            if take < self.floor_bit or (leftover and take < least_leftover):
                take = 0.0
            takes.append((other, take))
            left -= take
        return takes

    def _time_ahead_s(self, turn: Turn) -> float | None:
        """How long the passes ahead of ``turn`` take at their rates (None: unshaped)."""
        if self.link_bit is None:
            return None
        total = 0.0
        for other, take in self._takes():
            if other is turn:
                return total
            total += 8 * other.left_bytes / (take or self.link_bit)
        return total
