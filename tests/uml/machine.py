"""Boot Debian's user-mode Linux (`/usr/bin/linux`, kernel 6.1, with netem) as an
ordinary process, run a shell script in it as init, and collect what it wrote.

The UML kernel's root is this machine's filesystem (hostfs), so the project's .venv and
tree run inside unchanged and whatever the script writes under a host path lands on the
host's disk. Everything else is the UML kernel's own: its namespaces, links, qdiscs and
BPF programs go with it when it halts, and nothing of them is ever on the host.

What the init script gets before the caller's body (the traps of ../shared/PLATFORM.md):
/proc, /sys, a tmpfs /run with /run/netns (for `ip netns`), a tmpfs /dev/shm, a PATH,
the UML kernel's modules under a tmpfs /lib/modules (the host's stays untouched) and
the modules the testbed uses loaded; Debian's newest kernel headers under
/usr/src (6.1, installed by scripts/setup.sh for BCC) linked as that kernel's `build`
and `source`, as setup.sh links them for the host's, so BCC compiles there too; TMPDIR
on a tmpfs; the body's output to a log file; then `halt -f`.

The kernel and all its helper processes share one process group, ours alone: on a
timeout the whole group is killed, and it is killed after a clean halt too if any
process of it is left, so no UML process outlives `boot`.
"""

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

LINUX = "/usr/bin/linux"   # Debian's user-mode-linux package
MODULES = "/usr/lib/uml/modules"
# veth and bridge for the topology, the qdiscs and classifiers tailcut uses or
# probes, vxlan for doctor's probe.
LOAD = ("veth", "bridge", "sch_htb", "sch_netem", "sch_ingress", "cls_bpf", "cls_u32",
        "act_mirred", "vxlan")
HALT_GRACE_S = 5.0

PREAMBLE = """\
#!/bin/sh
# Written by tests/uml/machine.py: init of a user-mode Linux boot.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 TMPDIR=/run/tmp
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t tmpfs none /run
mkdir -p /run/netns /run/tmp
mkdir -p /dev/shm   # the UML's devtmpfs has none
mount -t tmpfs none /dev/shm
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
release=$(uname -r)
mount -t tmpfs none /lib/modules
mkdir /lib/modules/$release
for entry in {modules}/$release/*; do ln -s "$entry" /lib/modules/$release/; done
arch_hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1)
common_hdr=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n 1)
if [ -n "$arch_hdr" ] && [ -n "$common_hdr" ]; then
  ln -s "$arch_hdr" /lib/modules/$release/build
  ln -s "$common_hdr" /lib/modules/$release/source
fi
modprobe -a {load}
ip link set lo up
cd {cwd}
"""


class UmlMissing(Exception):
    """The user-mode-linux package is not installed."""


@dataclass(frozen=True)
class Boot:
    """What one boot left: the console, how long it ran, how it ended."""

    console: str        # the UML kernel's console (its messages and the init's stderr)
    log: str            # the body's output
    wall_s: float       # from starting `linux` to its exit
    timed_out: bool     # killed at the timeout
    returncode: int

    def tail(self, lines: int = 40) -> str:
        """The end of the body's log and of the console, for a failure message."""
        return ("-- body's log, last lines:\n" + "\n".join(self.log.splitlines()[-lines:])
                + "\n-- console, last lines:\n"
                + "\n".join(self.console.splitlines()[-lines // 2:]))


def available() -> bool:
    return os.access(LINUX, os.X_OK) and os.path.isdir(MODULES)


def boot(body: str, workdir: Path, timeout_s: float, mem: str = "1536M",
         cwd: Path = Path("/")) -> Boot:
    """Boot with `body` (shell) as the tail of init, from `cwd`; its output goes to
    workdir/body.log, the console to workdir/console.log. Bounded by `timeout_s`."""
    if not available():
        raise UmlMissing(f"{LINUX} or {MODULES} is missing: install Debian's "
                         "user-mode-linux package (scripts/setup.sh --tests does)")
    workdir.mkdir(parents=True, exist_ok=True)
    init = workdir / "init.sh"
    log = workdir / "body.log"
    init.write_text(PREAMBLE.format(modules=MODULES, load=" ".join(LOAD), cwd=cwd)
                    + f"(\n{body}\n) > {log} 2>&1\nsync\nhalt -f\n")
    init.chmod(0o755)
    console_path = workdir / "console.log"
    started = time.monotonic()
    timed_out = False
    with open(console_path, "wb") as console:
        # con0 on our stdout only: the UML never reads a terminal of ours.
        process = subprocess.Popen(
            [LINUX, f"mem={mem}", "rootfstype=hostfs", "rootflags=/", "rw",
             f"init={init}", "con=null", "con0=null,fd:1"],
            stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
            start_new_session=True)   # its own process group: killed as one
        try:
            returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(process.pid, signal.SIGKILL)
            returncode = process.wait()
        finally:
            _reap_group(process.pid)
    wall_s = time.monotonic() - started
    return Boot(console=console_path.read_text(errors="replace"),
                log=log.read_text(errors="replace") if log.exists() else "",
                wall_s=wall_s, timed_out=timed_out, returncode=returncode)


def _reap_group(pgid: int) -> None:
    """Wait for the UML's helper processes (the group we started) to end after its
    kernel did; kill whatever of the group is left after HALT_GRACE_S."""
    deadline = time.monotonic() + HALT_GRACE_S
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def which_venv_python(repo: Path) -> Path:
    """The project's venv Python, as the UML runs it (the same file as the host's)."""
    python = repo / ".venv" / "bin" / "python"
    if not python.exists():
        found = shutil.which("python3")
        raise FileNotFoundError(f"{python} is missing (scripts/setup.sh makes it); "
                                f"python3 on PATH: {found}")
    return python
