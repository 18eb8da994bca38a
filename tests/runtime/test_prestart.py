"""Role processes started before their pods: they wait, then enter the pod's namespace."""

import os
import time
from pathlib import Path

import pytest

from tailcut.net import netns
from tailcut.runtime import prestart
from tailcut.spec import load_file
from tests import waiting


def _netns_inode(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


@pytest.mark.netns
def test_a_waiting_role_enters_its_pods_namespace_before_reading_its_config(tmp_path):
    ns = f"tailcut-prestart-{os.getpid()}"
    netns.create(ns)
    pool = prestart.Pool(["worker-0"], [], tmp_path)
    try:
        proc = pool.waiting["worker-0"]
        time.sleep(0.3)
        assert _netns_inode(proc.pid) == os.stat("/proc/self/ns/net").st_ino  # host's, so far
        # a FIFO as its config: opening it blocks the role right after setns, to look
        os.mkfifo(tmp_path / "logs" / "worker-0.json")
        assert pool.assign("worker-0", netns.path(ns)) is proc and not pool.waiting
        assert waiting.until(
            lambda: _netns_inode(proc.pid) == os.stat(netns.path(ns)).st_ino, within_s=30)
    finally:
        pool.stop_unassigned()
        proc.kill()
        proc.wait()
        netns.remove(ns)


def test_a_role_sent_to_a_missing_namespace_fails_naming_it(tmp_path):
    pool = prestart.Pool(["worker-0"], ["worker-0"], tmp_path)
    proc = pool.assign("worker-0", "/run/netns/tailcut-no-such-namespace")
    assert proc.wait(timeout=60) == 1
    assert b"tailcut-no-such-namespace" in proc.stdout.read()
    assert "entering the network namespace" in (tmp_path / "logs" / "worker-0.log").read_text()


def test_roles_no_pod_took_are_killed_and_leave_no_empty_results_dir(tmp_path):
    out = tmp_path / "results"
    pool = prestart.Pool(["ps-0", "worker-0"], ["ps-0"], out)
    procs = list(pool.waiting.values())
    pool.stop_unassigned()
    assert all(p.returncode is not None for p in procs) and not pool.waiting
    assert not out.exists()   # a refused job leaves no directory behind


def test_the_pool_of_a_job_pipes_the_roles_the_runner_follows(tmp_path):
    from tailcut import plan
    job = load_file(Path(__file__).parents[2] / "examples" / "quickstart.yaml")
    pool = prestart.for_job(job, tmp_path)
    try:
        assert list(pool.waiting) == job.spec.pod_names()
        piped = {name for name, p in pool.waiting.items() if p.stdout is not None}
        assert piped == {plan.leader(job)}
    finally:
        pool.stop_unassigned()
