"""The host's CPU and its processes' over a window, read from /proc for real."""

import os
import subprocess
import sys
import time

from tailcut.fidelity import hostcpu, processes

BUSY = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"


def busy_child(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", BUSY.format(s=seconds)])


def test_a_window_counts_a_busy_core_as_busy():
    before = hostcpu.read()
    child = busy_child(1.0)
    child.wait()
    window = hostcpu.window(before, hostcpu.read())
    # one of the host's cores spun for the whole second
    assert window["busy"] >= 0.9 / window["cores"]
    assert 0.9 <= window["wall_s"] < 5
    assert set(window) == {"wall_s", "cores", "busy", "softirq", "steal", "psi_some", "load1"}


def test_cpu_pressure_is_read_where_the_kernel_has_it():
    reading = hostcpu.read()
    try:
        open(hostcpu.PRESSURE).close()
    except OSError:
        assert reading.psi_some_us is None
    else:
        assert reading.psi_some_us is not None and reading.psi_some_us >= 0


def test_the_jobs_processes_are_told_from_the_others_and_the_kernels():
    job, stranger = busy_child(1.0), busy_child(1.0)
    # this process is the job's, but not everything it started: the stranger is not
    tally = processes.Tally(roots={job.pid}, own=frozenset({os.getpid()}))
    tally.add(processes.read())
    time.sleep(0.8)
    tally.add(processes.read())
    job.wait()
    stranger.wait()
    summary = tally.summary(wall_s=0.8, cores=2)
    # each child spun for the whole window, on a core of its own or a shared one
    assert summary["cpu_s"]["job"] >= 0.05
    assert summary["cpu_s"]["others"] >= 0.05
    assert "python" in " ".join(summary["busiest_others"])


def test_kernel_threads_belong_to_the_kernel():
    procs = processes.read()
    by_pid = {pid: p for (pid, _), p in procs.items()}
    kthreads = [pid for pid, p in by_pid.items() if p.ppid == processes.KTHREADD]
    assert kthreads, "no kernel thread listed"
    assert processes.owner(kthreads[0], by_pid, roots=set()) == "kernel"


def test_a_process_below_an_own_pid_is_not_the_jobs_unless_below_a_root():
    procs = {10: processes.Proc(ppid=1, name="runner", ticks=0),
             11: processes.Proc(ppid=10, name="role", ticks=0),
             12: processes.Proc(ppid=11, name="role-child", ticks=0),
             13: processes.Proc(ppid=10, name="hog", ticks=0)}
    kinds = {pid: processes.owner(pid, procs, roots={11}, own=frozenset({10}))
             for pid in procs}
    assert kinds == {10: "job", 11: "job", 12: "job", 13: "others"}
