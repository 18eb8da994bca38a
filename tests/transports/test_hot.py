"""The hot store's wire format and fixed point, from the same tor.h the program
compiles with: Q8.24's error bound, saturation, and malformed replies refused."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailcut.transports import base, hot


def test_the_header_and_constants_come_from_tor_h():
    assert hot.header().size == hot.const("HEADER") == 32
    assert hot.STRIDE == (1500 - 20 - 8 - 32) // 4
    assert hot.reasons()[:3] == ["pulled", "pushed", "counted"]
    assert len(hot.reasons()) == 21 and hot.reasons()[-1] == "reply_failed"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-127.9, 127.9, allow_nan=False), min_size=1, max_size=50))
def test_a_value_is_within_half_a_step_and_a_sum_of_t_within_t_half_steps(values):
    fixed, saturated = hot.to_fixed(np.array(values))
    assert saturated == 0
    back = fixed.astype(np.float64) / hot.SCALE
    assert np.max(np.abs(back - values)) <= 2 ** -25
    total = fixed.astype(np.int64).sum() / hot.SCALE   # integer sums: order-free
    assert abs(total - sum(values)) <= len(values) * 2 ** -25 + 1e-9


def test_values_past_the_range_saturate_and_are_counted():
    fixed, saturated = hot.to_fixed(np.array([200.0, -300.0, 1.0]))
    assert saturated == 2
    assert list(fixed[:2]) == [np.iinfo(np.int32).max, np.iinfo(np.int32).min]


def test_a_request_round_trips_and_a_bad_reply_is_refused():
    data = hot.packet(hot.PULL, worker=3, job=7, iteration=9, slot=1,
                      payload=np.arange(4, dtype="<i4").tobytes())
    header, payload = hot.parse(data)
    assert (header.op, header.worker, header.job, header.iteration, header.slot,
            header.count) == (hot.PULL, 3, 7, 9, 1, 4)
    assert np.frombuffer(payload, "<i4").tolist() == [0, 1, 2, 3]
    for bad, says in ((data[:10], "bytes, header is 32"), (b"XXXX" + data[4:], "magic"),
                      (data + b"\0", "for count 4")):
        with pytest.raises(base.ProtocolError, match=says):
            hot.parse(bad)


@pytest.mark.netns
def test_with_the_path_down_a_hot_store_request_is_sent_again_until_its_timeout(
        no_route: str) -> None:
    """The hot store's client (transports.hot) treats a refused request as a lost one:
    it resends it, and ends with its timeout's error, which names the store."""
    from tailcut.net import netns
    with netns.entered(no_route):
        client = hot.Client("10.77.0.1", job=7, worker=1, elements=10, timeout_s=0.2)
    try:
        with pytest.raises(base.ProtocolError, match="did not answer"):
            client.pull(0)
        assert client.stats.requests == 0
    finally:
        client.close()
