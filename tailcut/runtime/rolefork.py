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

`ahead_of` forks a job's roles before the runner has imported the rest of what it
needs (pyroute2, the network, the datapath) and built the network: each loads its
dataset and imports its model on the core the runner leaves idle meanwhile, then
waits; the local runtime starts it (PendingRole.start) in its pod once built.
"""

from __future__ import annotations

import ctypes
import faulthandler
import functools
import gc
import io
import os
import select
import signal
import socket
import sys
import time
import traceback
from typing import IO, Callable, Optional

from tailcut import transports
from tailcut.ml import models
from tailcut.net import netns, topology
from tailcut.runtime import procs
from tailcut.spec.model import TrainingJob
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
    def role() -> int:
        _detach()
        netns.setns_fd(ns_fd)
        return _run_role(out_fd, err_fd, config_path)
    _exit_with(role)


def _exit_with(body: Callable[[], int]) -> None:
    """Run a forked child's `body` and exit with its status (1 if it raised, after
    the traceback): a child must never return to the runner's code."""
    status = 1
    try:
        status = body()
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


def _detach() -> None:
    """What a child of the runner does first: its own signals, death with the runner."""
    # The runner's objects stay as they are, untouched: never collected here, so
    # no finaliser closes a descriptor number a role's socket has reused since.
    gc.freeze()
    gc.enable()   # off in a runner still importing (tailcut.cli), as it forks ahead_of
    faulthandler.disable()   # if enabled, on a descriptor closed below
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _run_role(out_fd: int, err_fd: int, config_path: str) -> int:
    """The role on stdout `out_fd` and stderr `err_fd`, no other descriptor."""
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
    return role.main([config_path])


class PendingRole:
    """A role's process forked before its pod's network exists (`ahead`): it does
    `ahead` (loads its dataset, say) on the core the runner leaves idle while it
    builds the network, then waits; `start` gives it its namespace, config file and
    streams, `abandon` ends it unstarted."""

    def __init__(self, pid: int, sock: socket.socket, namespace: str) -> None:
        self.pid = pid
        self.namespace = namespace
        self._sock: Optional[socket.socket] = sock

    def start(self, config_path: str, piped: bool, log_path: str) -> ForkedRole:
        """Run the role (see `start` of this module): from now on a ForkedRole."""
        assert self._sock is not None, "started or abandoned already"
        if os.geteuid() == 0:   # this process's priority again, even mid-prepare
            try:
                os.setpriority(os.PRIO_PROCESS, self.pid, os.getpriority(os.PRIO_PROCESS, 0))
            except ProcessLookupError:
                pass   # it died waiting: see below
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        read_fd, write_fd = os.pipe() if piped else (-1, -1)
        try:
            socket.send_fds(self._sock, [config_path.encode()],
                            [log_fd, write_fd] if piped else [log_fd])
        except BrokenPipeError:
            pass   # it died waiting: the runtime finds its exit status (poll) and says so
        finally:
            for fd in (log_fd, write_fd):
                if fd >= 0:
                    os.close(fd)
            self._sock.close()
            self._sock = None
        return ForkedRole(self.pid, os.fdopen(read_fd, "rb") if piped else None)

    def abandon(self) -> None:
        """End it, if not started: it exits when its socket closes; reaped here."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            os.waitpid(self.pid, 0)


def ahead_of(job: TrainingJob) -> dict[str, PendingRole]:
    """Every role of `job`, forked now (if this process may fork its roles, see
    `enable`) to wait for its network: each loads its dataset meanwhile, on a core
    the runner leaves idle while it imports the rest and builds the network. By pod
    name; the local runtime starts them."""
    if not (enabled() and procs.single_threaded()):
        return {}
    if job.spec.transport.type in transports.names():
        transports.load(job.spec.transport.type)   # imported once here, not in each role
    # Once here what every role would import for itself: numpy's random generators
    # (~20 ms) and the codec that socket.create_connection encodes a host with
    import numpy.random  # noqa: F401
    "".encode("idna")
    t = job.spec.training
    prepare = functools.partial(models.load_ahead, t.model_ref, t.seed)
    return {pod.name: ahead(pod.netns, prepare) for pod in topology.plan(job).pods
            if pod.role not in topology.BACKGROUND_ROLES}


def needs_no_more_imports(job: TrainingJob) -> bool:
    """Whether `job`'s roles need only the modules imported with this one (and so may
    be forked before the runner imports the rest): a TCP job's without CadentFlow's
    tags, whose DSCP classifier imports pyroute2, as the datagram transports do."""
    return job.spec.transport.type == "tcp" and job.spec.scheduling.policy != "cadentflow"


def ahead(namespace: str, prepare: Callable[[], None]) -> PendingRole:
    """Fork a role for pod `namespace` (which need not exist yet) that runs `prepare`
    now and the role once started (PendingRole.start). What `prepare` raises is
    ignored: the role then does that work itself."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sys.stdout.flush()   # or the child's copy of a buffer is printed twice
    sys.stderr.flush()
    try:
        pid = os.fork()
        if pid == 0:
            ours.close()
            _pending_child(theirs, namespace, prepare)   # no return
    finally:
        theirs.close()
    return PendingRole(pid, ours, namespace)


def _pending_child(sock: socket.socket, namespace: str, prepare: Callable[[], None]) -> None:
    def role() -> int:
        _detach()
        # Until started, a ^C at the terminal is the runner's to handle (it abandons us)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        keep = sock.fileno()   # and stdin, stdout, stderr: the runner's, until started
        os.closerange(3, keep)
        os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
        # At nice 19 meanwhile, so as to take only the core the runner leaves idle: at
        # the same priority, five of these slowed the runner's own imports, the path
        # to the first iteration. The runner (root) raises it again as it starts us.
        if os.geteuid() == 0:
            os.setpriority(os.PRIO_PROCESS, 0, 19)
        try:
            prepare()
        except Exception:   # noqa: BLE001 - the role does it again, and says what failed
            pass
        message, fds, _, _ = socket.recv_fds(sock, 4096, 2)
        if not message:   # abandoned: the runner closed its end
            return 0
        sock.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        ns_fd = netns.enter_fd(namespace)
        netns.setns_fd(ns_fd)
        os.close(ns_fd)
        log_fd = fds[0]
        return _run_role(fds[1] if len(fds) > 1 else log_fd, log_fd, message.decode())
    _exit_with(role)
