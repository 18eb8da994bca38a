"""Compile a program under ebpf/ with BCC and load its functions, or raise DatapathError.

BCC prints the compiler's and the verifier's messages on the process's stderr and
raises a bare Exception that says only "Failed to compile". The message is what a
person needs, so fd 2 is captured while BCC works and put into the DatapathError.
"""

import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tailcut import ebpfheaders
from tailcut.errors import DatapathError, NoKernelHeaders


EBPF_DIR = ebpfheaders.EBPF_DIR   # re-exported: the loaders and tests find programs here

ProgType = Literal["sched_cls", "xdp"]

log = logging.getLogger(__name__)

# Redirecting fd 2 is process-wide: one compile at a time.
_stderr_lock = threading.Lock()

_compiled_s = 0.0   # what load() spent in this process, for the run's overheads


def compile_seconds() -> float:
    """Seconds this process has spent compiling and loading programs (with BCC, or
    from a cached image: bpfcache)."""
    return _compiled_s


def add_load_seconds(seconds: float) -> None:
    """Count a load that did not go through load() (bpfcache's)."""
    global _compiled_s
    _compiled_s += seconds


def fd_prog_id(fd: int, function: str) -> int:
    """The kernel's id of the program open at `fd`, as `bpftool prog show id N` takes it."""
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == "prog_id":
                return int(value)
    raise DatapathError(f"fd {fd} of {function} is not a BPF program")


@dataclass
class Program:
    """A compiled BPF module and the fds of its loaded functions."""

    stem: str
    bpf: Any  # bcc.BPF; bcc ships no type hints
    fds: dict[str, int]
    compile_s: float = field(default=0.0)

    def prog_id(self, function: str) -> int:
        """The kernel's id of a loaded function, as `bpftool prog show id N` takes it."""
        return fd_prog_id(self.fds[function], function)

    def table(self, name: str) -> Any:
        """The BCC view of map `name` (types come from the C declaration)."""
        return self.bpf[name.encode()]

    def close(self) -> None:
        """Close the program and map fds. Programs still attached stay in the kernel."""
        self.bpf.cleanup()


def source(stem: str) -> Path:
    return EBPF_DIR / f"{stem}.bpf.c"


@contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """Collect what C code writes to fd 2 during the body; yields a one-item list."""
    out: list[str] = []
    with _stderr_lock, tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            out.append(tmp.read().decode(errors="replace").strip())


MODULES_DIR = Path("/lib/modules")
KHEADERS = Path("/sys/kernel/kheaders.tar.xz")


def headers_problem(release: str = "", modules: Path = MODULES_DIR,
                    kheaders: Path = KHEADERS) -> str | None:
    """Why BCC would find no headers of the running kernel (None: it would). BCC
    takes them from /lib/modules/<release>/build, else from the kernel itself
    (CONFIG_IKHEADERS: /sys/kernel/kheaders.tar.xz, or the kheaders module it loads).
    Asked before compiling: BCC's own words for this come after a screen of clang
    errors about missing files."""
    release = release or os.uname().release
    build = modules / release / "build"
    if build.is_dir() or kheaders.exists():
        return None
    try:
        if "kheaders.ko" in (modules / release / "modules.dep").read_text():
            return None
    except OSError:
        pass
    where = (f"{build} points to {os.readlink(build)}, which is not here"
             if build.is_symlink() else f"{build} is not here")
    return (f"the headers of the running kernel {release} are missing: {where}. "
            "Install them (Debian: linux-headers-$(uname -r)). In a Kubernetes pod they "
            "are the node's /usr/src and /lib/modules, mounted read-only; a kind node has "
            "the host's /usr/src only if its config mounts it (extraMounts "
            "{hostPath: /usr/src, containerPath: /usr/src, readOnly: true} on every node, "
            "as scripts/kind-up.sh writes; docs/kubernetes.md, Installing on kind)")


def load(stem: str, functions: Mapping[str, ProgType],
         cflags: Sequence[str] = ()) -> Program:
    """Compile ebpf/<stem>.bpf.c (its directory on the include path) and load each
    function in `functions` as the given program type."""
    path = source(stem)
    if not path.is_file():
        raise DatapathError(f"BPF source {path} is missing: ebpf/ is package data of "
                            "tailcut (reinstall tailcut)")
    missing = headers_problem()
    if missing:
        raise NoKernelHeaders(f"cannot compile {path.name}: {missing}")
    try:
        from bcc import BPF  # imported here so that importing tailcut never needs BCC
    except ImportError as err:
        raise DatapathError("BCC is not importable: run scripts/setup.sh (it installs "
                            "python3-bpfcc and links it into .venv)") from err
    types = {"sched_cls": BPF.SCHED_CLS, "xdp": BPF.XDP}
    flags = [f"-I{EBPF_DIR}", *cflags]
    started = time.monotonic()
    bpf = None
    with _captured_stderr() as messages:
        try:
            bpf = BPF(src_file=str(path).encode(), cflags=flags)
            fds = {name: bpf.load_func(name.encode(), types[kind]).fd
                   for name, kind in functions.items()}
        except Exception as err:  # BCC raises bare Exception for every failure
            failure: Exception | None = err
        else:
            failure = None
    text = messages[0]
    if failure is not None:
        if bpf is not None:
            bpf.cleanup()
        step = "compile" if bpf is None else "load"
        # BCC compiles the file's text under the name /virtual/main.c; name the file.
        said = text.replace("/virtual/main.c", str(path)) or str(failure)
        raise DatapathError(f"cannot {step} {path.name} with cflags {list(cflags)}:\n"
                            f"{said}") from failure
    if text:
        log.debug("BCC said while compiling %s: %s", path.name, text)
    global _compiled_s
    took = time.monotonic() - started
    _compiled_s += took
    return Program(stem, bpf, fds, took)
