"""Fixtures for the datapath tests (helpers in udp_link.py)."""

from collections.abc import Iterator

import pytest

from tests.datapath.udp_link import Link, build_link, remove_link


@pytest.fixture
def link() -> Iterator[Link]:
    built = build_link("f")
    try:
        yield built
    finally:
        remove_link(built)
