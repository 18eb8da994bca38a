"""SO_MAX_PACING_RATE on a socket: set, read back, lifted."""

import socket

import pytest

from tailcut.scheduling import pacing


def test_a_rate_is_set_in_whole_bytes_per_second_and_can_be_lifted():
    with socket.socket() as sock:
        assert pacing.rate_of(sock) is None
        pacing.set_rate(sock, 1234.4)
        assert pacing.rate_of(sock) == 1234
        pacing.set_rate(sock, None)
        assert pacing.rate_of(sock) is None


def test_a_rate_above_32_bits_is_clamped_not_refused():
    with socket.socket() as sock:
        pacing.set_rate(sock, 1e12)
        assert pacing.rate_of(sock) == 0xFFFFFFFE


@pytest.mark.parametrize("rate", [0, -5.0, float("nan")])
def test_a_rate_that_is_not_positive_is_refused(rate):
    with socket.socket() as sock, pytest.raises(ValueError, match="must be > 0"):
        pacing.set_rate(sock, rate)
