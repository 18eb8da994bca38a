"""Remove what runs left behind: the namespaces named after a job, the processes
inside them, and with them every veth, bridge, qdisc and tc program of the job.

Only namespaces whose names carry tailcut's prefix are touched, and only processes
inside those namespaces are ended (all of them were started by tailcut).

Links are deleted before their namespaces go, because the kernel releases a namespace
(and the links in it) asynchronously, and a run is not clean until its veths are gone.
Every link tailcut creates is in interface group naming.GROUP, so one request per
namespace deletes them all (a veth's peer goes with it); links outside the group (an
older tailcut's, a VXLAN device) are then deleted one by one."""

import errno
import os
import signal
import time

from tailcut.net import naming, netns, rtnl

_GONE = (errno.ESRCH, errno.ENODEV, errno.ENOENT)  # already gone is success


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
        pids = [pid for pid in netns.pids_inside_any(names) if pid != os.getpid()]
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
        sock = rtnl.socket_in(name)
    except Exception:
        return   # the namespace is gone already
    with sock:
        batch = rtnl.Batch()
        batch.delete_group(naming.GROUP)
        batch.send(sock, tolerate=_GONE)
        # What the group did not hold (a pod namespace has only lo left by now).
        if all(link_name == "lo" for link_name, _, _ in rtnl.link_states(sock)):
            return
    _delete_others(name)


def _delete_others(name: str) -> None:
    from pyroute2.netlink.exceptions import NetlinkError
    with netns.ipr(name) as ipr:
        for link in ipr.get_links():
            if link.get_attr("IFLA_IFNAME") == "lo":
                continue
            try:
                ipr.link("del", index=link["index"])
            except NetlinkError as err:
                if err.code not in _GONE:
                    raise
