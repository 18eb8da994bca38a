"""A pod's network namespace: found through a process of the pod, named for the agent.

The process is the one the container runtime recorded for one of the pod's running
containers (containerd's runc shim: init.pid in the task's bundle; CRI-O: conmon's
pidfile), once its cgroup confirms it is the pod's; else one whose cgroup names the
pod's UID and one of its container IDs; else one whose cgroup names the pod's UID.

The name is a bind mount under /run/netns, as `ip netns attach` makes, but only inside
the agent's own mount namespace: tck8s-<first 12 characters of the pod UID>.
"""

import ctypes
import os
import re
import stat
from pathlib import Path
from typing import Any, Iterable, Iterator, NamedTuple, Optional

from tailcut.k8s.agent.errors import AgentError
from tailcut.net import netns

PREFIX = "tck8s-"
MS_BIND = 4096
_libc = ctypes.CDLL(None, use_errno=True)


def netns_name(pod_uid: str) -> str:
    return PREFIX + pod_uid.replace("-", "")[:12]


# The node runtime's state dir, as the agent sees it (a read-only hostPath mount).
RUNTIME_STATE_ENV = "TAILCUT_RUNTIME_STATE"
# containerd's `state` setting; CRI-O's: containers/storage's `runroot`.
DEFAULT_STATE = {"containerd": Path("/run/containerd"),
                 "cri-o": Path("/run/containers/storage")}
CONTAINERD_TASKS = "io.containerd.runtime.v2.task"   # the runc v2 shim's plugin dir
CONTAINERD_K8S_NAMESPACE = "k8s.io"                  # the CRI plugin's namespace
# Both runtimes name a container by 64 lowercase hex digits; anything else from the
# API is refused before it becomes part of a path.
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")
_PID = re.compile(r"[0-9]{1,10}")   # ASCII only: int() would take other scripts' digits
_PID_FILE_MAX = 64


class Found(NamedTuple):
    """A process of a pod and how it was found: "runtime" (the runtime's record,
    confirmed by the cgroup) or "cgroup" (a scan of /proc). `container_id` is the
    container it belongs to, None when only the pod's UID matched."""
    pid: int
    how: str
    container_id: Optional[str]


def running_container_ids(pod: Any) -> list[str]:
    """The IDs, as the API spells them ("containerd://<hex>"), of the pod's running
    containers: none yet, or none given (as the tests' pods), is an empty list."""
    statuses = getattr(pod.status, "container_statuses", None) or []
    return [s.container_id for s in statuses
            if s.container_id and s.state is not None and s.state.running is not None]


def _parse_container_id(reported: str) -> Optional[tuple[str, str]]:
    """(runtime, id) from "<runtime>://<id>"; None when the id is not 64 hex digits."""
    runtime, sep, cid = reported.partition("://")
    if not sep or not _CONTAINER_ID.fullmatch(cid):
        return None
    return runtime, cid


def _uid_spellings(pod_uid: str) -> tuple[str, str]:
    # cgroupfs drivers write the UID with dashes, systemd's with underscores.
    return pod_uid, pod_uid.replace("-", "_")


def _cgroup(pid: str, proc: Path) -> Optional[str]:
    try:
        return (proc / pid / "cgroup").read_text()
    except OSError:
        return None   # the process ended meanwhile, or is not ours to read


def _read_pid_file(path: Path) -> Optional[int]:
    """The pid in `path`, or None for anything but a regular file holding a positive
    decimal number. Not followed through a symlink, nor waited on as a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, _PID_FILE_MAX + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > _PID_FILE_MAX:
        return None
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    if not _PID.fullmatch(text) or int(text) <= 0:
        return None
    return int(text)


def _runtime_records(runtime: str, cid: str, state: Path) -> Iterator[Path]:
    """Where `runtime` keeps the pid of container `cid`'s first process."""
    if runtime == "containerd":
        # The runc v2 shim's bundle: <state>/io.containerd.runtime.v2.task/<ns>/<id>.
        yield state / CONTAINERD_TASKS / CONTAINERD_K8S_NAMESPACE / cid / "init.pid"
    elif runtime == "cri-o":
        # The bundle is containers/storage's run dir for the container,
        # <runroot>/<graph driver>-containers/<id>/userdata; conmon writes the pidfile.
        for per_driver in sorted(state.glob("*-containers")):
            yield per_driver / cid / "userdata" / "pidfile"


def pid_from_runtime(pod_uid: str, container_ids: Iterable[str],
                     state: Optional[Path] = None,
                     proc: Path = Path("/proc")) -> Optional[Found]:
    """A process of the pod from the runtime's own record of one of `container_ids`
    (as the API reports them), kept only when its cgroup names the pod's UID: a stale
    record's pid may since belong to another process. `state`: the runtime's state
    dir; by default $TAILCUT_RUNTIME_STATE, else the runtime's default."""
    wanted = _uid_spellings(pod_uid)
    if state is None and os.environ.get(RUNTIME_STATE_ENV):
        state = Path(os.environ[RUNTIME_STATE_ENV])
    for reported in container_ids:
        parsed = _parse_container_id(reported)
        if parsed is None or parsed[0] not in DEFAULT_STATE:
            continue
        runtime, cid = parsed
        for record in _runtime_records(
                runtime, cid, state if state is not None else DEFAULT_STATE[runtime]):
            pid = _read_pid_file(record)
            if pid is None:
                continue
            cgroup = _cgroup(str(pid), proc)
            if cgroup is not None and any(w in cgroup for w in wanted):
                return Found(pid, "runtime", cid)
    return None


def _scan(pod_uid: str, container_ids: tuple[str, ...], proc: Path) -> Optional[Found]:
    """The first process whose cgroup names the pod's UID and, if `container_ids`,
    one of them too."""
    wanted = _uid_spellings(pod_uid)
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        cgroup = _cgroup(entry.name, proc)
        if cgroup is None or not any(w in cgroup for w in wanted):
            continue
        if not container_ids:
            return Found(int(entry.name), "cgroup", None)
        for cid in container_ids:
            if cid in cgroup:
                return Found(int(entry.name), "cgroup", cid)
    return None


def find_pod_process(pod_uid: str, container_ids: Iterable[str] = (),
                     state: Optional[Path] = None,
                     proc: Path = Path("/proc")) -> Optional[Found]:
    """A process of the pod: from the runtime's record of one of `container_ids`
    (pid_from_runtime); else the first process whose cgroup names the pod's UID and
    one of those containers (a host process a monitor put in the pod's cgroup names
    no container); else, as pid_of_pod, the first whose cgroup names the UID."""
    reported = list(container_ids)
    found = pid_from_runtime(pod_uid, reported, state, proc)
    if found is not None:
        return found
    ids = tuple(p[1] for p in map(_parse_container_id, reported) if p is not None)
    if ids:
        found = _scan(pod_uid, ids, proc)
        if found is not None:
            return found
    return _scan(pod_uid, (), proc)


def pid_of_pod(pod_uid: str, proc: Path = Path("/proc")) -> Optional[int]:
    """A process of the pod, found by its UID in the cgroup path alone."""
    found = _scan(pod_uid, (), proc)
    return found.pid if found else None


def netns_inode(pid: str) -> int:
    """The inode of the network namespace of `pid` ('self', 'thread-self' or a number):
    two processes share a namespace when these are equal."""
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def in_nodes_netns(pid: int) -> bool:
    """Whether `pid` is in the node's network namespace: the agent's own (it runs on
    the node's network; this thread's, as tests enter a node's namespace per thread)
    or init's (it shares the node's PID namespace). Wiring such a process's namespace
    would move the node's own links; a runtime may put a host-network process, such as
    a monitor, into a pod's cgroup, where a scan of /proc finds it."""
    theirs = netns_inode(str(pid))
    if theirs == netns_inode("thread-self"):
        return True
    try:
        return theirs == netns_inode("1")
    except PermissionError:   # init is not ours to inspect (root in a sandbox): the
        return False          # agent's own namespace, checked above, is the node's


def attach(name: str, pid: int) -> None:
    """Name the network namespace of `pid` (replacing a stale name)."""
    _name(name, f"/proc/{pid}/ns/net", f"pid {pid}")


def attach_fd(name: str, fd: int) -> None:
    """Name the network namespace open as `fd` in this process (one the holder kept)."""
    _name(name, f"/proc/self/fd/{fd}", f"descriptor {fd}")


def _name(name: str, source: str, what: str) -> None:
    os.makedirs(netns.RUN_DIR, exist_ok=True)
    target = netns.path(name)
    detach(name)
    os.close(os.open(target, os.O_RDONLY | os.O_CREAT, 0))
    if _libc.mount(source.encode(), target.encode(), b"none", MS_BIND, None) != 0:
        err = ctypes.get_errno()
        os.unlink(target)
        raise AgentError(f"cannot name the network namespace of {what}: "
                         f"{os.strerror(err)}")


def detach(name: str) -> None:
    """Drop the name; already gone is fine."""
    netns.remove(name)
