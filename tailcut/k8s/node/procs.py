"""Start a cluster daemon inside a node's network namespace, and stop it by its PID.

Only the network namespace is switched (`nsenter --net`), not the mount namespace
(`ip netns exec` would remount /sys and hide the cgroup hierarchy the kubelet and runc
need), except on a node that looks like kind's: its containerd and kubelet share a
mount namespace of their own (cluster.py). The daemons outlive the command that started them (their own session), so
`tailcut cluster up` can return; their PIDs are kept in the cluster's state file.
"""

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

from tailcut.errors import TailcutError


class ClusterError(TailcutError):
    """A component of the local cluster is missing, did not come up, or failed."""


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return "    (no log)"
    return "\n".join("    " + line for line in text)


def spawn(netns: Path, argv: list[str], log: Path, mount_ns: Optional[Path] = None) -> int:
    """Start `argv` in network namespace `netns` (and mount namespace `mount_ns`, if
    given), output to `log`; its PID."""
    log.parent.mkdir(parents=True, exist_ok=True)
    enter = [f"--net={netns}"] + ([f"--mount={mount_ns}"] if mount_ns else [])
    with open(log, "ab") as out:
        proc = subprocess.Popen(["nsenter", *enter, "--", *argv], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    return proc.pid


def alive(pid: int) -> bool:
    """Whether `pid` runs and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass   # not our child (started by an earlier `tailcut cluster up`)


def stop(pid: int, timeout_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after `timeout_s`; already gone is fine."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            reap(pid)
            if not alive(pid):
                return
            time.sleep(0.1)


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def pids_in_cgroup(fragment: str) -> list[int]:
    """Processes whose cgroup path contains `fragment` (a node's cgroupRoot)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if fragment in (entry / "cgroup").read_text():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
