"""A pod's network namespace: found by the pod's UID in /proc, named for the agent.

The name is a bind mount under /run/netns, as `ip netns attach` makes, but only inside
the agent's own mount namespace: tck8s-<first 12 characters of the pod UID>.
"""

import ctypes
import os
from pathlib import Path
from typing import Optional

from tailcut.k8s.agent.errors import AgentError
from tailcut.net import netns

PREFIX = "tck8s-"
MS_BIND = 4096
_libc = ctypes.CDLL(None, use_errno=True)


def netns_name(pod_uid: str) -> str:
    return PREFIX + pod_uid.replace("-", "")[:12]


def pid_of_pod(pod_uid: str, proc: Path = Path("/proc")) -> Optional[int]:
    """A process of the pod, found by its UID in the cgroup path. cgroupfs drivers
    write the UID with dashes, systemd's with underscores."""
    wanted = (pod_uid, pod_uid.replace("-", "_"))
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroup = (entry / "cgroup").read_text()
        except OSError:
            continue  # the process ended meanwhile, or is not ours to read
        if any(w in cgroup for w in wanted):
            return int(entry.name)
    return None


def netns_inode(pid: str) -> int:
    """The inode of the network namespace of `pid` ('self', 'thread-self' or a number):
    two processes share a namespace when these are equal."""
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def in_nodes_netns(pid: int) -> bool:
    """Whether `pid` is in the node's network namespace: the agent's own (it runs on
    the node's network; this thread's, as tests enter a node's namespace per thread)
    or init's (it shares the node's PID namespace). Wiring such a process's namespace
    would move the node's own links; a runtime may put a host-network process, such as
    a monitor, into a pod's cgroup, where `pid_of_pod` finds it."""
    theirs = netns_inode(str(pid))
    if theirs == netns_inode("thread-self"):
        return True
    try:
        return theirs == netns_inode("1")
    except PermissionError:   # init is not ours to inspect (root in a sandbox): the
        return False          # agent's own namespace, checked above, is the node's


def attach(name: str, pid: int) -> None:
    """Name the network namespace of `pid` (replacing a stale name)."""
    os.makedirs(netns.RUN_DIR, exist_ok=True)
    target = netns.path(name)
    detach(name)
    os.close(os.open(target, os.O_RDONLY | os.O_CREAT, 0))
    if _libc.mount(f"/proc/{pid}/ns/net".encode(), target.encode(), b"none", MS_BIND,
                   None) != 0:
        err = ctypes.get_errno()
        os.unlink(target)
        raise AgentError(f"cannot name the network namespace of pid {pid}: "
                         f"{os.strerror(err)}")


def detach(name: str) -> None:
    """Drop the name; already gone is fine."""
    netns.remove(name)
