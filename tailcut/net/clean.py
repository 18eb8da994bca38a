"""Remove what runs left behind: the namespaces named after a job, the processes
inside them, and with them every veth, bridge, qdisc and tc program of the job.

Only namespaces whose names carry tailcut's prefix are touched, and only processes
inside those namespaces are ended (all of them were started by tailcut)."""

import os
import signal
import time

from pyroute2.netlink.exceptions import NetlinkError

from tailcut.net import naming, netns

_GONE = (3, 19)  # ESRCH, ENODEV: already gone is success


def job_of(namespace: str) -> str:
    """'tailcut-quickstart.worker-0' -> 'quickstart'."""
    return namespace[len(naming.PREFIX):].split(".", 1)[0]


def leftovers(job: str | None = None) -> list[str]:
    """Namespaces of `job` (every tailcut job when None) present on this host."""
    prefix = naming.job_prefix(job) if job else naming.PREFIX
    return netns.list_names(prefix)


def remove_job(job: str, wait_s: float = 5.0) -> list[str]:
    return remove(leftovers(job), wait_s)


def remove_all(wait_s: float = 5.0) -> list[str]:
    return remove(leftovers(None), wait_s)


def remove(names: list[str], wait_s: float = 5.0) -> list[str]:
    """End the processes in `names`, delete their links, then the namespaces."""
    _kill_inside(names, wait_s)
    for name in names:
        _delete_links(name)
    for name in names:
        netns.remove(name)
    return names


def _kill_inside(names: list[str], wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        # Never ourselves: a thread of this process may be inside one while building.
        pids = [pid for name in names for pid in netns.pids_inside(name)
                if pid != os.getpid()]
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


def _delete_links(name: str) -> None:
    # Deleting a device is synchronous, unlike the namespace's own release, so the
    # veths are gone (from both ends) when this returns.
    try:
        ipr = netns.ipr(name)
    except Exception:
        return
    with ipr:
        for link in ipr.get_links():
            if link.get_attr("IFLA_IFNAME") == "lo":
                continue
            try:
                ipr.link("del", index=link["index"])
            except NetlinkError as err:
                if err.code not in _GONE:
                    raise
