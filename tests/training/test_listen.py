"""A role listening on its own address waits for it to come back (an agent restart
on Kubernetes removes a pod's tc0 and its successor adds it again), for a bounded
time, and then fails naming the address; any other failure to listen is not retried."""

import errno
import threading
import time

import pytest

from tailcut import errors, transports
from tailcut.training import peers
from tailcut.transports import base

MISSING = "192.0.2.1"   # TEST-NET-1: on no interface of this host


class AddressBackAfter(base.Transport):
    """The tcp transport, whose first `missing` listens go to an address not on this
    host (the pod's address gone): the kernel's real EADDRNOTAVAIL."""

    def __init__(self, missing: int) -> None:
        super().__init__()
        self.tcp = transports.get("tcp")
        self.missing = missing
        self.calls = 0

    def listen(self, host, port, count, timeout_s):
        self.calls += 1
        if self.calls <= self.missing:
            host = MISSING
        return self.tcp.listen(host, port, count, timeout_s)

    def connect(self, host, port, timeout_s):
        return self.tcp.connect(host, port, timeout_s)

    def close(self):
        self.tcp.close()


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_listen_is_retried_until_the_address_comes_back_and_then_accepts():
    transport = AddressBackAfter(missing=3)
    port = free_port()
    connected = []
    client = threading.Thread(target=lambda: connected.append(
        transports.get("tcp").connect("127.0.0.1", port, 10)))
    client.start()
    conns = peers.listen(transport, "127.0.0.1", port, 1, time.monotonic() + 10)
    client.join()
    assert transport.calls == 4 and len(conns) == 1 and connected
    for conn in conns + connected:
        conn.close()


def test_an_address_that_does_not_come_back_fails_naming_it_after_the_wait():
    port = free_port()
    started = time.monotonic()
    with pytest.raises(errors.RunError) as caught:
        peers.listen(transports.get("tcp"), MISSING, port, 1, time.monotonic() + 10,
                     address_wait_s=0.6)
    waited = time.monotonic() - started
    assert 0.6 <= waited < 3, waited
    assert f"cannot listen on {MISSING}:{port}" in str(caught.value)
    assert "in 0.6 s of waiting" in str(caught.value) and "node agent" in str(caught.value)
    assert isinstance(caught.value.__cause__, base.TransportError)


def test_the_wait_ends_with_the_roles_deadline():
    started = time.monotonic()
    with pytest.raises(errors.RunError):
        peers.listen(transports.get("tcp"), MISSING, free_port(), 1,
                     time.monotonic() + 0.5, address_wait_s=60)
    assert time.monotonic() - started < 3


def test_a_port_in_use_is_not_retried():
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        transport = AddressBackAfter(missing=0)
        started = time.monotonic()
        with pytest.raises(base.TransportError) as caught:
            peers.listen(transport, "127.0.0.1", port, 1, time.monotonic() + 10)
    assert transport.calls == 1 and time.monotonic() - started < 1
    assert caught.value.__cause__.errno == errno.EADDRINUSE
