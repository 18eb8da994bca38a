"""Fixtures shared by the transports' tests."""

import os
import socket
import subprocess
from collections.abc import Iterator

import pytest

from tailcut.net import netns
from tailcut.transports import rxfast


@pytest.fixture(params=["compiled", "numpy"])
def receive_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each receive step both ways: rxfast.c's, and the numpy code it stands in for
    (what runs where no C compiler is)."""
    if request.param == "compiled":
        assert rxfast.library() is not None, rxfast.status()
        yield "compiled"
        return
    mp = pytest.MonkeyPatch()
    mp.setattr(rxfast, "library", lambda: None)
    try:
        yield "numpy"
    finally:
        mp.undo()


@pytest.fixture
def sockets() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A receiving and a sending UDP socket on loopback (the receiver's buffer holds a
    burst of bursts; its reads give up after 2 s)."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    rx.settimeout(2)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.bind(("127.0.0.1", 0))
    try:
        yield rx, tx
    finally:
        rx.close()
        tx.close()


@pytest.fixture
def no_route() -> Iterator[str]:
    """A network namespace with only loopback: every other address is unreachable,
    as from a pod whose link a restarting node agent has just removed."""
    name = f"tailcut-noroute-{os.getpid()}"
    netns.create(name)
    try:
        with netns.entered(name):
            subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        netns.remove(name)
