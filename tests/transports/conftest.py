"""Fixtures shared by the transports' tests."""

import os
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
