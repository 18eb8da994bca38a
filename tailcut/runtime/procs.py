"""Start a process inside a pod's network namespace, tied to our lifetime.

The child enters the namespace with setns(2) between fork and exec, and asks the
kernel to SIGKILL it when its parent dies (PR_SET_PDEATHSIG): a `kill -9` of the
runner then leaves no training process behind, only namespaces for `tailcut clean`."""

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Iterator
from typing import IO, Any, Optional, Protocol

from tailcut.net import netns

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


class Process(Protocol):
    """What the runtime does with a role's process: a subprocess.Popen, or a fork of
    the runner (tailcut.runtime.rolefork.ForkedRole)."""

    pid: int

    @property
    def stdout(self) -> Optional[IO[bytes]]: ...

    def poll(self) -> Optional[int]: ...

    def wait(self, timeout: Optional[float] = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


def single_threaded() -> bool:
    """Whether this process has one thread, Python's or a library's (a BLAS pool): only
    then may it fork and go on running Python in the child (a lock another thread
    held would stay locked there)."""
    return len(os.listdir("/proc/self/task")) == 1


def spawn(namespace: str, argv: list[str], stdout: Optional[IO[bytes]] | int,
          stderr: Optional[IO[bytes]] | int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    fd = netns.enter_fd(namespace)

    def enter() -> None:  # runs in the child, before exec
        netns.setns_fd(fd)
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    try:
        return subprocess.Popen(argv, stdout=stdout, stderr=stderr, env=env,
                                preexec_fn=enter, stdin=subprocess.DEVNULL)
    finally:
        os.close(fd)


def stop(proc: Process, grace_s: float = 2.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`; reap either way."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def terminate_as_exit() -> Iterator[None]:
    """Turn SIGTERM (and SIGHUP) into SystemExit so `finally` blocks tear down."""
    def handler(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
