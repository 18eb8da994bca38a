"""Roles forked from the runner: in their pod's namespace, with only their own streams,
followed and reaped like a Popen."""

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from tailcut.net import netns
from tailcut.runtime import procs, rolefork

# Run in a fresh interpreter: pytest's process has threads (BLAS's), which rule forking out.
SCRIPT = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from tailcut.runtime import procs, rolefork
    ns, config, log = sys.argv[1:]
    assert procs.single_threaded()
    role = rolefork.start(ns, config, piped=True, log_path=log)
    deadline = time.monotonic() + 30   # it enters the namespace, then blocks opening
    while os.stat(f"/proc/{role.pid}/ns/net").st_ino != os.stat(f"/run/netns/{ns}").st_ino:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    fds = sorted(int(fd) for fd in os.listdir(f"/proc/{role.pid}/fd"))
    try:
        role.wait(timeout=0.2)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    with open(config, "w") as fifo:     # the config it waits for: not JSON
        fifo.write("not json")
    event = json.loads(role.stdout.readline())
    print(json.dumps({"fds": fds, "timed_out": timed_out, "event": event,
                      "code": role.wait(timeout=30), "poll": role.poll()}))
""")


@pytest.mark.netns
def test_a_forked_role_runs_in_its_pod_with_only_its_streams_and_reports_its_exit(tmp_path):
    ns = f"tailcut-rolefork-{os.getpid()}"
    netns.create(ns)
    try:
        config = tmp_path / "worker-0.json"
        os.mkfifo(config)   # opening it blocks the role right after setns: time to look
        env = {**os.environ, **rolefork.BLAS_THREADS}
        out = subprocess.run([sys.executable, "-c", SCRIPT, ns, str(config),
                              str(tmp_path / "worker-0.log")],
                             capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        seen = json.loads(out.stdout)
    finally:
        netns.remove(ns)
    assert seen["fds"] == [0, 1, 2]   # nothing of the runner's: no netlink, no pipes
    assert seen["timed_out"]
    assert seen["event"]["event"] == "error" and str(config) in seen["event"]["message"]
    assert seen["code"] == seen["poll"] == 2   # exits.USAGE: its config is not JSON
    assert str(config) in (tmp_path / "worker-0.log").read_text()


def test_a_process_with_another_thread_is_not_single_threaded():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert not procs.single_threaded()
    finally:
        stop.set()
        thread.join()


def test_only_a_runner_that_limited_blas_before_numpy_forks_its_roles(monkeypatch):
    """A role forked from a process whose numpy kept OpenBLAS's default thread pool
    inherits it (five roles spinning on two cores: 4x the JCT in a bench)."""
    for k, v in rolefork.BLAS_THREADS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(rolefork, "_enabled", False)
    rolefork.enable(numpy_loaded_after=False)   # e.g. a bench that imported numpy first
    assert not rolefork.enabled()
    rolefork.enable(numpy_loaded_after=True)    # `tailcut run`
    assert rolefork.enabled()
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    rolefork.enable(numpy_loaded_after=True)
    assert not rolefork.enabled()


# A role forked ahead of its namespace: `prepare` runs at once, the role once started.
AHEAD_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    from tailcut.net import netns
    from tailcut.runtime import rolefork
    ns, config, log, marker = sys.argv[1:]
    role = rolefork.ahead(ns, lambda: open(marker, "w").write(str(os.getpid())))
    gone = rolefork.ahead(ns, lambda: None)
    deadline = time.monotonic() + 30
    while not os.path.exists(marker) or not open(marker).read():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    waiting_fds = sorted(int(fd) for fd in os.listdir(f"/proc/{role.pid}/fd"))
    nice = lambda: int(open(f"/proc/{role.pid}/stat").read().rsplit(")", 1)[1].split()[16])
    waiting_nice = nice()
    gone.abandon()   # ends unstarted, reaped
    netns.create(ns)   # its network exists only now
    try:
        started = role.start(config, piped=True, log_path=log)
        while os.stat(f"/proc/{role.pid}/ns/net").st_ino != os.stat(f"/run/netns/{ns}").st_ino:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        running_nice = nice()   # it blocks opening its config, a FIFO
        with open(config, "w") as fifo:
            fifo.write("not json")
        event = json.loads(started.stdout.readline())
        print(json.dumps({"prepared_by": int(open(marker).read()), "pid": role.pid,
                          "waiting_fds": waiting_fds, "event": event,
                          "nice": [waiting_nice, running_nice],
                          "code": started.wait(timeout=30)}))
    finally:
        netns.remove(ns)
""")


@pytest.mark.netns
def test_a_role_forked_ahead_prepares_before_its_namespace_exists_then_runs_in_it(tmp_path):
    config = tmp_path / "worker-0.json"
    os.mkfifo(config)
    env = {**os.environ, **rolefork.BLAS_THREADS}
    out = subprocess.run([sys.executable, "-c", AHEAD_SCRIPT,
                          f"tailcut-rolefork-ahead-{os.getpid()}", str(config),
                          str(tmp_path / "worker-0.log"), str(tmp_path / "prepared")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["prepared_by"] == seen["pid"]   # in the role's own process
    # stdin, stdout, stderr and its socket to the runner: no other role's, no netlink
    assert seen["waiting_fds"][:3] == [0, 1, 2] and len(seen["waiting_fds"]) == 4
    assert seen["nice"] == [19, os.getpriority(os.PRIO_PROCESS, 0)]   # low until started
    assert seen["event"]["event"] == "error" and str(config) in seen["event"]["message"]
    assert seen["code"] == 2   # exits.USAGE: its config is not JSON
    assert str(config) in (tmp_path / "worker-0.log").read_text()


@pytest.mark.parametrize("example, early", [("quickstart", True), ("cadentflow", False),
                                            ("bounded-loss", False)])
def test_only_a_tcp_job_without_cadentflow_tags_is_forked_before_the_runners_imports(
        example, early):
    """The roles of the others import pyroute2 (the DSCP classifier, a datagram
    link's rate), which the runner imports after forking such roles ahead."""
    from pathlib import Path
    from tailcut import spec
    job = spec.load_file(Path(__file__).parents[2] / "examples" / f"{example}.yaml")
    assert rolefork.needs_no_more_imports(job) is early
