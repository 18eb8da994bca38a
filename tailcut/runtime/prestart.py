"""Role processes started before their pods exist, so their imports overlap tailcut's.

A role's interpreter spends about 0.3 s of CPU importing numpy and the training
modules; five of them, started once the network is up, kept both cores busy for most
of a second before the PS could start training. A `Pool` starts every role of a job
at once, right after the spec is loaded (`python -m tailcut.training.role --wait`),
while the runner still imports its own modules and builds the network on the other
core. Each process waits on its stdin; `assign` writes the pod's namespace there, and
the role enters it (setns) before it reads its configuration or opens a socket, so
a role never sees the host's network. Until then a role is a plain child of the
runner, dying with it (PR_SET_PDEATHSIG) and killed if the run ends before its pod
is built (`stop_unassigned`).

This module imports nothing heavy on purpose: it runs before the runtime's imports.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tailcut.spec.model import TrainingJob

PR_SET_PDEATHSIG = 1
# Five or more roles share two cores: one BLAS thread each (the role sets them too,
# before numpy loads; here for anything it starts).
ROLE_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def for_job(job: "TrainingJob", results_dir: Path) -> "Pool":
    """A pool of `job`'s roles. The runner follows the events of the leading role
    (tailcut.plan.leader: ps-0, or worker-0 under syncMode allreduce, named here to
    keep plan's imports out of this module) and of the PS replica."""
    leader = "worker-0" if job.spec.training.sync_mode == "allreduce" else "ps-0"
    return Pool(job.spec.pod_names(), [leader, "replica-0"], results_dir)


def _die_with_parent() -> None:   # runs in the child, before exec
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Pool:
    """One waiting role process per pod name, its output going where the run's does:
    `piped` pods' stdout to a pipe (the runner follows their JSON events), every
    other stream to logs/<pod>.log under `results_dir`."""

    def __init__(self, pods: list[str], piped: list[str], results_dir: Path) -> None:
        logs = results_dir / "logs"
        # What this pool made, to remove again if no role runs (a refused job).
        self._made = [d for d in (results_dir, logs) if not d.exists()]
        self._logs = logs
        logs.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **ROLE_ENV}
        self.waiting: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for pod in pods:
                argv = [sys.executable, "-m", "tailcut.training.role", "--wait",
                        str(logs / f"{pod}.json")]
                with open(logs / f"{pod}.log", "wb") as log:
                    self.waiting[pod] = subprocess.Popen(
                        argv, stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE if pod in piped else log, stderr=log,
                        env=env, preexec_fn=_die_with_parent)
        except BaseException:
            self.stop_unassigned()
            raise

    def assign(self, pod: str, netns_path: str) -> subprocess.Popen[bytes]:
        """Send `pod`'s process into the namespace at `netns_path` and let it run (its
        config file must be written by now); it leaves the pool."""
        proc = self.waiting.pop(pod)
        assert proc.stdin is not None
        try:
            proc.stdin.write(netns_path.encode() + b"\n")
            proc.stdin.close()
        except BrokenPipeError:
            pass   # it died while waiting: its exit status tells the runner
        return proc

    def stop_unassigned(self) -> None:
        """Kill the processes no pod took (a run that failed before its roles started):
        they have done nothing but import."""
        pods, procs = list(self.waiting), list(self.waiting.values())
        self.waiting = {}
        for proc in procs:
            proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    try:
                        stream.close()
                    except BrokenPipeError:
                        pass
        for pod in pods:   # the logs of roles that never ran, if they stayed empty
            log = self._logs / f"{pod}.log"
            if log.exists() and log.stat().st_size == 0:
                log.unlink()
        for made in reversed(self._made):
            try:
                made.rmdir()
            except OSError:
                pass   # something was written there: the run's results, keep them
