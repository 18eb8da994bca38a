"""Fixtures shared by the transports' tests."""

import os
import subprocess
from collections.abc import Iterator

import pytest

from tailcut.net import netns


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
