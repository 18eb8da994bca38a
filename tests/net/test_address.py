"""A pod's entrypoint waits for the address the node agent gives it on tc0."""

import threading
import time

import pytest

from tailcut.errors import NetError
from tailcut.net import address, netns

pytestmark = pytest.mark.netns


@pytest.fixture
def pod_ns():
    name = "tailcut-addrtest.pod"
    netns.create(name)
    yield name
    netns.remove(name)


def add_later(ns: str, ip: str, delay_s: float) -> threading.Thread:
    def add() -> None:
        time.sleep(delay_s)
        with netns.ipr(ns) as ipr:
            # A veth with both ends here: this kernel may lack the dummy driver.
            ipr.link("add", ifname="tc0", kind="veth", peer="tc0-peer")
            index = ipr.link_lookup(ifname="tc0")[0]
            ipr.addr("add", index=index, address=ip, prefixlen=24)
            ipr.link("set", index=ipr.link_lookup(ifname="tc0-peer")[0], state="up")
            ipr.link("set", index=index, state="up")
    thread = threading.Thread(target=add)
    thread.start()
    return thread


def test_waits_until_the_address_is_there_and_names_its_interface(pod_ns):
    adder = add_later(pod_ns, "10.1.0.3", 0.3)
    with netns.entered(pod_ns):
        assert address.find(ip="10.1.0.3") is None
        started = time.monotonic()
        assert address.wait_for(10, "pod worker-0", ip="10.1.0.3") == ("tc0", "10.1.0.3")
        assert time.monotonic() - started >= 0.2
        assert address.find(ifname="tc0") == ("tc0", "10.1.0.3")
        assert address.find(ip="10.1.0.4") is None and address.find(ifname="eth0") is None
    adder.join()


def test_an_address_that_never_comes_is_named_after_the_timeout(pod_ns):
    with netns.entered(pod_ns):
        with pytest.raises(NetError, match=r"pod bg-client-0: waited 0.2 s for an IPv4 "
                                           r"address on tc0 \(its address on the job's"):
            address.wait_for(0.2, "pod bg-client-0", ifname="tc0")
