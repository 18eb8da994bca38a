"""tc BPF filters on an interface's clsact hooks, with one record of who added the clsact.

The loss dropper (pref 1 on either hook), the CadentFlow classifier (egress, pref 2)
and the ToR programs (a rack port's ingress, pref 2 to 4) hang off the same clsact
qdisc of an interface. The qdisc is added by whichever comes first and must be
removed by whichever leaves last, so the record of which clsact qdiscs tailcut added
lives here, shared by all; a clsact someone else added is never removed.
"""

from __future__ import annotations

import errno
import threading
from typing import Literal

from pyroute2 import IPRoute, NetlinkError

from tailcut.errors import DatapathError, NetError
from tailcut.net import netns

Direction = Literal["egress", "ingress"]

# clsact's two hooks, as tc filter parents (TC_H_CLSACT major, TC_H_MIN_* minor).
PARENTS: dict[str, str] = {"egress": "ffff:fff3", "ingress": "ffff:fff2"}

# Errnos that mean the thing to delete is already gone (interface or filter).
_GONE = (errno.ENOENT, errno.ENODEV)

_lock = threading.Lock()
_added: set[tuple[str, int]] = set()  # (netns, ifindex) where tailcut added the clsact
# The netns name that means the calling thread's own namespace (a role in its pod).
HERE = ""


def ifindex(ipr: IPRoute, netns_name: str, ifname: str) -> int:
    """The index of `ifname` in the namespace `ipr` is bound to; a DatapathError if absent."""
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise DatapathError(f"no interface {ifname} in network namespace {netns_name}")
    return int(found[0])


def _has_clsact(ipr: IPRoute, index: int) -> bool:
    return any(q.get_attr("TCA_KIND") == "clsact" for q in ipr.get_qdiscs(index))


def _filters_left(ipr: IPRoute, index: int) -> int:
    # A dump lists each tcf_proto once with handle 0, then its filters.
    return sum(1 for parent in PARENTS.values()
               for f in ipr.get_filters(index, parent=parent) if f["handle"])


def _remove_if_unused(ipr: IPRoute, netns_name: str, index: int) -> None:
    """Delete the clsact if tailcut added it and no filter is left on it (caller holds _lock)."""
    key = (netns_name, index)
    if key not in _added:
        return
    if not _has_clsact(ipr, index):
        _added.discard(key)
    elif not _filters_left(ipr, index):
        ipr.tc("del", "clsact", index)
        _added.discard(key)


def record_added(netns_name: str, index: int) -> None:
    """Note that tailcut adds the clsact of interface `index` (a caller that sends the
    request itself, in a batch), so the last filter to leave removes it."""
    with _lock:
        _added.add((netns_name, index))


def add_filter(ipr: IPRoute, netns_name: str, ifname: str, index: int, *,
               direction: Direction, prio: int, handle: int, fd: int, name: str,
               classid: int, what: str) -> None:
    """Put BPF program `fd` (direct action) on `direction` of interface `index`, adding
    clsact if needed. `what` names the program in errors ("dropper", "classifier")."""
    with _lock:
        if not _has_clsact(ipr, index):
            _added.add((netns_name, index))
        # replace, not add: harmless if a clsact appeared meanwhile.
        ipr.tc("replace", "clsact", index)
    try:
        ipr.tc("add-filter", "bpf", index, handle=handle, parent=PARENTS[direction],
               prio=prio, fd=fd, name=name, classid=classid, direct_action=True)
    except NetlinkError as err:
        with _lock:
            _remove_if_unused(ipr, netns_name, index)
        if err.code == errno.EEXIST:
            raise DatapathError(
                f"{ifname} in {netns_name} already has a filter at {direction} pref {prio} "
                f"handle {handle} (another {what}?); detach it first") from err
        raise DatapathError(f"cannot attach the {what} to {ifname} in {netns_name}: "
                            f"{err}") from err


def remove_filter(netns_name: str, ifname: str, index: int, *, direction: Direction,
                  prio: int, handle: int, what: str) -> None:
    """Delete the filter add_filter() put there, and the clsact if it is now unused.
    Harmless if the filter, the interface or the whole namespace is already gone."""
    try:
        ipr = IPRoute() if netns_name == HERE else netns.ipr(netns_name)
    except NetError:
        with _lock:  # namespace gone: the interface and its filters went with it
            _added.discard((netns_name, index))
        return
    with ipr:
        try:
            ipr.tc("del-filter", "bpf", index, handle=handle, parent=PARENTS[direction],
                   prio=prio)
        except NetlinkError as err:
            # EINVAL is what the kernel says when the clsact itself is gone.
            gone = err.code in _GONE or (err.code == errno.EINVAL and
                                         not _has_clsact(ipr, index))
            if not gone:
                raise DatapathError(f"cannot remove the {what} from {ifname} in "
                                    f"{netns_name}: {err}") from err
        with _lock:
            _remove_if_unused(ipr, netns_name, index)
