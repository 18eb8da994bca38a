"""A sender's own link, shared by the messages it sends at once: shortest remaining
first, at most each one's grant, what a grant leaves going to the next; under
CadentFlow the most urgent level first."""

import threading
import time

import pytest

from tailcut.transports import srpt
from tailcut.transports.congestion import MIN_RATE_BIT

GBIT = 1e9


def test_the_message_with_fewest_bytes_left_takes_the_whole_link_and_the_rest_wait() -> None:
    link = srpt.LinkSchedule(GBIT)
    big = link.enter(300_000, lambda: None)
    small = link.enter(20_000, lambda: None)   # a pass of retransmissions, say
    assert small.rate_bit() == GBIT
    assert big.rate_bit() == 0.0
    link.leave(small)
    assert big.rate_bit() == GBIT


def test_equal_messages_go_in_the_order_they_started_and_the_first_stays_ahead() -> None:
    link = srpt.LinkSchedule(GBIT)
    first, second = link.enter(260_000, lambda: None), link.enter(260_000, lambda: None)
    assert (first.rate_bit(), second.rate_bit()) == (GBIT, 0.0)
    first.sent(100_000, 60)
    assert (first.rate_bit(), second.rate_bit()) == (GBIT, 0.0)
    assert first.link_was_idle and not second.link_was_idle   # who gets the start credit


def test_what_a_grant_leaves_of_the_link_goes_to_the_next_message() -> None:
    grants = {"a": 0.3 * GBIT}
    link = srpt.LinkSchedule(GBIT)
    a = link.enter(10_000, lambda: grants["a"])          # its receiver's link is busy
    b = link.enter(20_000, lambda: None)
    c = link.enter(30_000, lambda: 0.5 * GBIT)
    assert a.rate_bit() == pytest.approx(0.3 * GBIT)
    assert b.rate_bit() == pytest.approx(0.7 * GBIT)
    assert c.rate_bit() == 0.0                            # b took the rest
    grants["a"] = 0.0                                     # a hostile grant: the floor
    assert a.rate_bit() == MIN_RATE_BIT


def test_a_scrap_of_the_link_left_by_a_grant_just_under_it_is_not_taken() -> None:
    """A grant of 997.3 Mbit/s ahead leaves 2.7: the next pass would send a whole burst
    and sleep 0.2 s at that rate, deaf to the link freeing up. It waits instead."""
    link = srpt.LinkSchedule(GBIT)
    ahead = link.enter(100_000, lambda: 997.3e6)
    behind = link.enter(260_000, lambda: GBIT)
    assert behind.rate_bit() == 0.0
    link.leave(ahead)
    assert behind.rate_bit() == GBIT


def test_a_link_slower_than_the_grant_floor_still_sends_at_its_own_rate() -> None:
    link = srpt.LinkSchedule(5e5)   # 500 kbit/s: below MIN_RATE_BIT
    only = link.enter(1_000, lambda: 0.0)
    assert only.rate_bit() == 5e5


def test_the_most_urgent_level_goes_first_then_the_shortest() -> None:
    link = srpt.LinkSchedule(GBIT)
    bulk = link.enter(1_000, lambda: None, levels=[2, 2])
    urgent = link.enter(50_000, lambda: None, levels=[0, 0, 1, 2])
    assert (urgent.rate_bit(), bulk.rate_bit()) == (GBIT, 0.0)
    urgent.sent(20_000, 3)   # its next packet is bulk too: now the shorter goes
    assert (urgent.rate_bit(), bulk.rate_bit()) == (0.0, GBIT)


def test_an_unshaped_link_orders_nothing_and_paces_at_the_grant_if_any() -> None:
    link = srpt.LinkSchedule(None)
    a, b = link.enter(1, lambda: None), link.enter(2, lambda: 5e8)
    assert a.rate_bit() is None
    assert b.rate_bit() == 5e8


def _waiting(turn: srpt.Turn, stop: threading.Event) -> tuple[threading.Thread, threading.Event]:
    woke = threading.Event()

    def wait() -> None:
        turn.wait(30, stop)
        woke.set()

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    time.sleep(0.05)
    return t, woke


def test_a_waiting_message_wakes_when_the_one_ahead_leaves_or_its_grant_leaves_room() -> None:
    grant = {"ahead": None}
    link = srpt.LinkSchedule(GBIT)
    ahead = link.enter(10**9, lambda: grant["ahead"])   # 8 s of link time: never overdue
    behind = link.enter(2 * 10**9, lambda: None)
    t, woke = _waiting(behind, threading.Event())
    assert not woke.is_set()
    grant["ahead"] = 0.5 * GBIT
    link.changed()            # what a GRANT does (datagram.py)
    assert woke.wait(5)       # well before the 30 s timeout
    assert behind.rate_bit() == pytest.approx(0.5 * GBIT)
    grant["ahead"] = None
    t, woke = _waiting(behind, threading.Event())
    assert not woke.is_set()
    link.leave(ahead)
    assert woke.wait(5)
    assert behind.rate_bit() == GBIT and link.sending == 1


def test_a_waiting_message_wakes_when_its_done_comes() -> None:
    link = srpt.LinkSchedule(GBIT)
    link.enter(10**9, lambda: None)
    behind = link.enter(2 * 10**9, lambda: None)
    stop = threading.Event()
    t, woke = _waiting(behind, stop)
    assert not woke.is_set()
    stop.set()
    link.changed()            # what a DONE does (datagram.py)
    assert woke.wait(5)


def test_a_pass_whose_wait_outlasts_the_ones_ahead_shares_the_link_with_them() -> None:
    """The pass ahead should be done in 1 ms (its thread lost its core, say): the one
    behind waits about that long, then goes at half the link next to it."""
    link = srpt.LinkSchedule(GBIT)
    ahead = link.enter(125_000, lambda: None)
    behind = link.enter(250_000, lambda: None)
    started = time.monotonic()
    behind.wait(30, threading.Event())
    assert time.monotonic() - started < 5      # not the 30 s timeout
    assert behind.overdue and behind.rate_bit() == GBIT / 2
    assert ahead.rate_bit() == GBIT


def test_a_wait_cut_short_by_its_timeout_is_not_overdue_before_the_ones_ahead_should_end() -> None:
    """10 MB ahead at 930 Mbit/s: 86 ms of link time, overdue after 1.25x that. The
    sender waits in slices of 50 ms (sender.TURN_WAIT_S): the first slice ending is
    not the pass being overdue, the deadline is."""
    link = srpt.LinkSchedule(GBIT)
    link.enter(10_000_000, lambda: 0.93 * GBIT)
    behind = link.enter(20_000_000, lambda: None)
    stop = threading.Event()
    started = time.monotonic()
    behind.wait(0.05, stop)
    assert not behind.overdue
    while not behind.overdue and time.monotonic() - started < 5:
        behind.wait(0.05, stop)
    assert behind.overdue and time.monotonic() - started >= 0.1
    assert behind.rate_bit() == pytest.approx(0.5 * GBIT)
