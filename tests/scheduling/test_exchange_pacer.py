"""The exchange's coflow controller: MADD rates set on the senders' sockets as flows
start, progress and end (real sockets, no network needed)."""

import socket

import pytest

from tailcut.scheduling import exchange, pacing


@pytest.fixture
def socks():
    made = [socket.socket() for _ in range(3)]
    yield made
    for s in made:
        s.close()


def test_a_coflows_flows_get_rates_in_proportion_to_their_bytes(socks):
    pacer = exchange.Pacer({"ps/up": 1000.0, "w0/down": 1000.0, "w1/down": 1000.0})
    pacer.start_many([(("pull", 0, 0), ("pull", 0), socks[0], ("ps/up", "w0/down"), 100),
                      (("pull", 1, 0), ("pull", 0), socks[1], ("ps/up", "w1/down"), 300)])
    # Gamma = 400 bytes / 1000 B/s on the PS link: 0.4 s -> 250 and 750 B/s.
    assert pacing.rate_of(socks[0]) == 250 and pacing.rate_of(socks[1]) == 750


def test_rates_follow_the_remaining_bytes_when_a_flow_ends(socks):
    pacer = exchange.Pacer({"ps/up": 1000.0, "w0/down": 1000.0, "w1/down": 1000.0})
    pacer.start_many([(("pull", 0, 0), ("pull", 0), socks[0], ("ps/up", "w0/down"), 100),
                      (("pull", 1, 0), ("pull", 0), socks[1], ("ps/up", "w1/down"), 300)])
    pacer.received(("pull", 1, 0), 200)
    pacer.finish(("pull", 0, 0))
    # Alone with 100 bytes left, the second flow gets the whole PS link.
    assert pacing.rate_of(socks[1]) == 1000


def test_a_second_coflow_on_a_full_link_waits_at_the_floor(socks):
    pacer = exchange.Pacer({"ps/up": 1000.0, "ps/down": 1000.0, "w0/up": 1000.0,
                            "w0/down": 1000.0})
    pacer.start(("pull", 0, 0), ("pull", 0), socks[0], ("ps/up", "w0/down"), 100)
    pacer.start(("pull", 0, 1), ("pull", 1), socks[1], ("ps/up", "w0/down"), 10_000)
    # The smaller coflow (Gamma 0.1 s) takes the link; the other is paced at the floor.
    assert pacing.rate_of(socks[0]) == 1000
    assert pacing.rate_of(socks[1]) == 1  # floor: 1000 / 1000
    # A push on the other direction is not in their way.
    pacer.start(("push", 0, 0), ("push", 0), socks[2], ("w0/up", "ps/down"), 50)
    assert pacing.rate_of(socks[2]) == 1000
