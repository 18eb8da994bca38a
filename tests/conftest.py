"""Shared test set-up: skip privileged tests for non-root users, and fail the
session if any test left a tailcut namespace behind."""

import os

import pytest

from tailcut.net import netns, naming

PRIVILEGED = ("netns", "bpf", "e2e")


def pytest_collection_modifyitems(config, items):
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root (network namespaces / BPF)")
    for item in items:
        if any(item.get_closest_marker(m) for m in PRIVILEGED):
            item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    left = netns.list_names(naming.PREFIX)
    if left:
        print(f"\nleftover tailcut namespaces after the suite: {left}")
        session.exitstatus = 1
