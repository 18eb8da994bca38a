"""Start a role as a fork of the runner, which has imported everything a role needs.

A role started as a new interpreter (`python -m tailcut.training.role`) spends ~0.3 s
of CPU importing numpy and the training modules before it does anything; five of
them kept both cores busy for most of a second before the PS could start training.
The runner has imported all of that already (the spec's check loads numpy, the plan
the training modules), so a fork of it starts the role in milliseconds. The child
does what Popen's child does before exec: its own session of signals, death with the
runner (PR_SET_PDEATHSIG), the pod's network namespace (setns), the role's stdout
and stderr, no other inherited descriptor; then it runs tailcut.training.role's main
and exits without returning to the runner's code.

Only a runner that limited BLAS to one thread before numpy loaded forks (``enable``,
which `tailcut run` calls): a role forked from any other process would inherit its
BLAS settings, and OpenBLAS's default pool of busy-waiting threads in five roles on
two cores made a bounded-loss quickstart run 4x longer on 4x the CPU (a bench calling
local.run). And only a single-threaded one (procs.single_threaded): a lock another
thread held would stay locked in the child. Other runners' roles start as new
interpreters, as before.
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import io
import os
import select
import signal
import sys
import time
import traceback
from typing import IO, Optional

from tailcut.net import netns
from tailcut.training import role   # here, once: every child has it without an import

PR_SET_PDEATHSIG = 1
# Five or more roles share two cores: one BLAS thread each. `tailcut run` sets these
# before numpy loads, in its own process, which its roles are forks of; set here too
# for whatever a role starts.
BLAS_THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_enabled = False


def enable(numpy_loaded_after: bool) -> None:
    """Let this process fork its roles: ``numpy_loaded_after`` says that numpy was
    imported only once BLAS_THREADS were set (the caller knows; importing this module
    imports numpy)."""
    global _enabled
    _enabled = numpy_loaded_after and all(os.environ.get(k) == v
                                          for k, v in BLAS_THREADS.items())


def enabled() -> bool:
    return _enabled


class ForkedRole:
    """A role running in a forked child: the part of subprocess.Popen's interface the
    local runtime uses (poll, wait, send_signal, terminate, kill, stdout, pid)."""

    def __init__(self, pid: int, stdout: Optional[IO[bytes]]) -> None:
        self.pid = pid
        self.stdout = stdout
        self.returncode: Optional[int] = None
        self._pidfd = os.pidfd_open(pid)

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                os.close(self._pidfd)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        """Its exit code (negative: the signal that ended it); after `timeout`
        seconds, subprocess.TimeoutExpired, as Popen.wait raises."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise _timeout(self.pid, timeout)
            select.select([self._pidfd], [], [], left)   # readable once it has exited
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _timeout(pid: int, timeout: Optional[float]) -> Exception:
    import subprocess   # TimeoutExpired: what callers of Popen.wait already catch
    return subprocess.TimeoutExpired([f"tailcut role (pid {pid})"], timeout or 0.0)


def start(namespace: str, config_path: str, piped: bool, log_path: str) -> ForkedRole:
    """Fork a role into pod `namespace` with the config file at `config_path`; its
    stdout to a pipe (`piped`: the runner follows its JSON events) or, as its stderr,
    to `log_path`."""
    ns_fd = netns.enter_fd(namespace)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    read_fd, write_fd = os.pipe() if piped else (-1, -1)
    sys.stdout.flush()   # or the child's copy of a buffer is printed twice
    sys.stderr.flush()
    try:
        pid = os.fork()
        if pid == 0:
            _child(ns_fd, write_fd if piped else log_fd, log_fd, config_path)   # no return
    finally:
        for fd in (ns_fd, log_fd, write_fd):
            if fd >= 0:
                os.close(fd)
    return ForkedRole(pid, os.fdopen(read_fd, "rb") if piped else None)


def _child(ns_fd: int, out_fd: int, err_fd: int, config_path: str) -> None:
    status = 1
    try:
        # The runner's objects stay as they are, untouched: never collected here, so
        # no finaliser closes a descriptor number a role's socket has reused since.
        gc.freeze()
        faulthandler.disable()   # if enabled, on a descriptor closed below
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        netns.setns_fd(ns_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((null, 0), (out_fd, 1), (err_fd, 2)):
            os.dup2(fd, target)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        # Python's streams anew on the new descriptors, unbuffered as PYTHONUNBUFFERED
        # makes them: the runner reads events as they are written.
        sys.stdin = open(0, closefd=False)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                      line_buffering=True, write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", line_buffering=True,
                                      write_through=True)
        os.environ.update(BLAS_THREADS)
        sys.argv = [role.__file__, config_path]
        status = role.main([config_path])
    except SystemExit as err:
        status = err.code if isinstance(err.code, int) else 1
    except BaseException:   # noqa: BLE001 - the child must never return to the runner
        try:
            traceback.print_exc()
        finally:
            status = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)
