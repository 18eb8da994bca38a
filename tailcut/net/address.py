"""Wait, inside a pod, until the pod's address on the job's links is there.

On Kubernetes the node agent adds a pod's second interface (tc0, with the address the
topology plans for it) once the kubelet reports the pod running, which is after the
pod's process has started: a role that bound or connected at once would find no such
address (EADDRNOTAVAIL) or no route. The pod entrypoints wait here first.
"""

import time

from pyroute2 import IPRoute, NetlinkError

from tailcut.errors import NetError

POLL_S = 0.1


def find(ip: str | None = None, ifname: str | None = None) -> tuple[str, str] | None:
    """(interface, address) of an IPv4 address here that is `ip` (or any) on an
    interface named `ifname` (or any) that is up; None if there is none yet."""
    with IPRoute() as ipr:
        for addr in ipr.get_addr(family=2):
            try:
                link = ipr.get_links(addr["index"])[0]
            except NetlinkError:
                continue   # the link went away since the address was listed
            name, found = link.get_attr("IFLA_IFNAME"), addr.get_attr("IFA_ADDRESS")
            if (ip in (None, found) and ifname in (None, name)
                    and link.get_attr("IFLA_OPERSTATE") in ("UP", "UNKNOWN")):
                return str(name), str(found)
    return None


def wait_for(timeout_s: float, who: str, ip: str | None = None,
             ifname: str | None = None) -> tuple[str, str]:
    """Wait until `find(ip, ifname)` finds the address; returns (interface, address).
    Raises NetError naming `who` and what it waited for after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = find(ip, ifname)
        if found is not None:
            return found
        if time.monotonic() >= deadline:
            wanted = (ip or "an IPv4 address") + (f" on {ifname}" if ifname else "")
            raise NetError(
                f"{who}: waited {timeout_s:g} s for {wanted} (its address on the job's "
                "links): the tailcut node agent adds it as tc0; is the agent running on "
                "this pod's node (kubectl get pods -A -l "
                "app.kubernetes.io/component=agent) and what does its log say?")
        time.sleep(POLL_S)
