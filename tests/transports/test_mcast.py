"""The multicast transport's ends as roles use them, with their path down (the ToR's
program itself: tests/datapath/test_mcast.py)."""

import numpy as np
import pytest

from tailcut.net import netns
from tailcut.transports import mcast


@pytest.mark.netns
def test_with_the_path_down_the_ps_publishes_nothing_and_says_so_and_a_worker_asks_later(
        no_route: str) -> None:
    """ENETUNREACH is loss, which the workers repair, not the end of the PS or of a
    worker."""
    with netns.entered(no_route):
        publisher = mcast.Publisher(job=7, elements=1000, racks=["10.77.0.1"],
                                    bind="127.0.0.1")
        receiver = mcast.Receiver(job=7, worker=1, elements=1000, ps="10.77.0.2",
                                  bind="127.0.0.2")   # (both bind the same port)
    try:
        publisher.publish(0, np.ones(1000, np.float32))
        assert publisher.stats.unsent == 1 and publisher.stats.published == 1
        receiver._ask(0, np.arange(3))
        assert receiver.stats.requests == 0
    finally:
        publisher.close()
        receiver.sock.close()
