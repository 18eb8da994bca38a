"""A sender's own link, shared by the messages it sends at once: shortest remaining
first, at most each one's grant, what a grant leaves going to the next."""

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
    first.sent(100_000)
    assert (first.rate_bit(), second.rate_bit()) == (GBIT, 0.0)


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


def test_an_unshaped_link_orders_nothing_and_paces_at_the_grant_if_any() -> None:
    link = srpt.LinkSchedule(None)
    a, b = link.enter(1, lambda: None), link.enter(2, lambda: 5e8)
    assert a.rate_bit() is None
    assert b.rate_bit() == 5e8


def test_a_waiting_message_wakes_when_the_one_ahead_leaves() -> None:
    link = srpt.LinkSchedule(GBIT)
    ahead, behind = link.enter(1, lambda: None), link.enter(2, lambda: None)
    woke = threading.Event()

    def wait() -> None:
        behind.wait(30)
        woke.set()

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.05)
    assert not woke.is_set()
    link.leave(ahead)
    assert woke.wait(5)   # well before the 30 s timeout
    t.join()
    assert behind.rate_bit() == GBIT and link.sending == 1
