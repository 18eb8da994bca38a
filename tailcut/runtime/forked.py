"""Run a function in a forked copy of this process: the report's second core.

The report draws five figures after the run; matplotlib spends most of a second of
CPU on them in one process while the machine's other core idles. `call(fn, ...)`
forks (the modules are already imported, so the child starts at once), runs `fn` in
the child and hands its pickled return value back through a pipe; `result()` waits
for it. A process with other threads (procs.single_threaded) is not forked: `fn` then
runs in `result()`, in this process.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from typing import Any, Callable, Generic, TypeVar

from tailcut.errors import RunError
from tailcut.runtime import procs

T = TypeVar("T")


class Call(Generic[T]):
    """A call under way in a child process (or, with other threads, still to make)."""

    def __init__(self, fn: Callable[..., T], *args: Any) -> None:
        self._name = getattr(fn, "__name__", repr(fn))
        self._pid = 0
        self._fd = -1
        self._inline: Callable[[], T] | None = None
        if not procs.single_threaded():
            self._inline = lambda: fn(*args)
            return
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()   # or the child's copy of a buffer is printed twice
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:   # the child: never returns to the caller's code
            status = 0
            try:
                os.close(read_fd)
                try:
                    payload = pickle.dumps(("ok", fn(*args)))
                except BaseException:   # noqa: BLE001 - handed to the parent, raised there
                    payload = pickle.dumps(("error", traceback.format_exc()))
                    status = 1
                with os.fdopen(write_fd, "wb") as pipe:
                    pipe.write(payload)
            finally:
                os._exit(status)
        os.close(write_fd)
        self._pid, self._fd = pid, read_fd

    def result(self) -> T:
        """`fn`'s return value. What it raised in the child comes as a RunError with
        its traceback; run here, as it was raised."""
        if self._inline is not None:
            return self._inline()
        with os.fdopen(self._fd, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(self._pid, 0)
        self._pid = 0
        if not data:
            raise RunError(f"{self._name}: its process ended without a result "
                           f"(wait status {status})")
        kind, value = pickle.loads(data)
        if kind == "error":
            raise RunError(f"{self._name} failed:\n{value}")
        return value   # type: ignore[no-any-return]


def call(fn: Callable[..., T], *args: Any) -> Call[T]:
    """Start `fn(*args)` in a forked child; `.result()` of the answer waits for it."""
    return Call(fn, *args)
