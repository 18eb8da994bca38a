"""Shared test set-up: skip privileged tests for non-root users, and fail the
session if the tests left anything of tailcut's behind: a namespace, a host link or
a BPF program that was not there before (so another person's run on the same host
does not fail ours)."""

import json
import os
import shutil
import subprocess

# One BLAS (and torch) thread in the test process, as `tailcut run`, `tailcut sweep`
# and every role set for themselves (tailcut/cli.py, tailcut/runtime/rolefork.py): on
# two cores a thread pool per process spins against the roles and the other tests.
# Measured: 300 deep-mlp SGD steps take 2.7 s with one thread, 19 s with the default
# pool on a busy host. Only effective before numpy loads: nothing here has loaded it
# yet (the processes a test starts inherit it; a test that needs another value sets
# its own, as tests/runtime/test_rolefork.py does).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import pytest  # noqa: E402

from tailcut.net import naming, netns  # noqa: E402
from tests import waiting

PRIVILEGED = ("netns", "bpf", "e2e", "cluster")


def pytest_collection_modifyitems(config, items):
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root (network namespaces / BPF)")
    for item in items:
        if any(item.get_closest_marker(m) for m in PRIVILEGED):
            item.add_marker(skip)


def tailcut_objects() -> set[str]:
    """Namespaces, host links and BPF programs that carry tailcut's names."""
    found = {f"netns {n}" for n in netns.list_names(naming.PREFIX)}
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    found |= {f"link {line.split(':')[1].strip()}" for line in links.splitlines()
              if naming.ALIAS_PREFIX in line}
    if os.geteuid() == 0 and shutil.which("bpftool"):
        progs = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True,
                               text=True).stdout
        found |= {f"bpf prog {p['id']} {p.get('name')}" for p in json.loads(progs or "[]")
                  if str(p.get("name", "")).startswith("tailcut")}
    return found


def pytest_sessionstart(session):
    session.config.tailcut_before = tailcut_objects()


def pytest_sessionfinish(session, exitstatus):
    # A BPF program is freed an RCU grace period after its last holder lets go.
    waiting.until(lambda: not tailcut_objects() - session.config.tailcut_before, every_s=0.1)
    left = sorted(tailcut_objects() - session.config.tailcut_before)
    if left:
        print(f"\nthe tests left tailcut objects behind: {left}")
        session.exitstatus = 1


@pytest.fixture(scope="session")
def k8s_tools(request):
    """The Kubernetes binaries the k8s and cluster tests run, built once if missing
    (`scripts/setup.sh --tests` builds them up front), the build's progress shown
    although pytest captures the output."""
    from tailcut.k8s.node import tools

    if tools.missing(tools.ALL):
        capture = request.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled():
            tools.ensure(tools.ALL, progress=lambda line: print(f"\n{line}", flush=True))
    return tools.tools_dir()
