"""CadentFlow tags to HTB priority classes by the tc program ebpf/classifier.bpf.c.

    c = classifier.attach("tailcut-cf.ps-0", "eth0")    # clsact egress, pref 2
    ...
    c.counts()       # {level: (packets, bytes)}, level None = untagged
    c.detach()

A sender tags a flow with IP_TOS = dscp_of(level) << 2; the program maps DSCP
TAILCUT_DSCP_BASE + level to skb->priority = 1:(0x20 + level), and HTB (built by
tailcut.net.shaping.apply_priorities) sends the packet to that class. What attach()
adds, as `tc filter show dev eth0 egress` shows it:

    filter protocol all pref 2 bpf chain 0 handle 0x1 flowid :1 tailcut_classify ...

The loss dropper sits at pref 1 of the same hook and returns TC_ACT_UNSPEC for the
packets it keeps, so every surviving packet reaches the classifier. The program is
compiled once per process and shared by every interface; the filter's classid is the
attachment's counter slot (see ebpf/classifier.h). detach() deletes the filter, and
the clsact qdisc too if this module added it and no filter is left on it.
"""

from __future__ import annotations

import errno
import threading
from typing import Optional

from pyroute2 import IPRoute, NetlinkError

from tailcut.datapath import bcc
from tailcut.errors import DatapathError, NetError
from tailcut.net import netns

STEM = "classifier"
FUNCTION = "tailcut_classify"
COUNTS_MAP = "class_counts"
EGRESS = "ffff:fff3"
FILTER_PRIO = 2     # after the loss dropper (pref 1)
FILTER_HANDLE = 1
HTB_MAJOR = 1       # tailcut.net.shaping's root qdisc is 1:
LEVELS = 8          # TAILCUT_PRIORITY_LEVELS
DSCP_BASE = 8       # TAILCUT_DSCP_BASE
CLASS_BASE = 0x20   # TAILCUT_CLASS_BASE
SLOTS = 256         # TAILCUT_CLASS_SLOTS
_GONE = (errno.ENOENT, errno.ENODEV)

_lock = threading.Lock()
_program: Optional[bcc.Program] = None
_slots: set[int] = set()
_owned_clsact: set[tuple[str, int]] = set()


def dscp_of(level: int) -> int:
    """The DSCP a sender sets for priority `level` (0 = most urgent)."""
    if not 0 <= level < LEVELS:
        raise ValueError(f"priority level {level}: must be in 0..{LEVELS - 1}")
    return DSCP_BASE + level


def tos_of(level: int) -> int:
    """The IP_TOS socket option value for priority `level` (DSCP in the upper 6 bits)."""
    return dscp_of(level) << 2


def class_minor(level: int) -> int:
    """The HTB class minor the classifier picks for `level` (1:20 + level, hex)."""
    return CLASS_BASE + level


def _acquire() -> tuple[bcc.Program, int]:
    global _program
    if _program is None:
        _program = bcc.load(STEM, {FUNCTION: "sched_cls"},
                            cflags=[f"-DTAILCUT_HTB_MAJOR={HTB_MAJOR}"])
    slot = next((s for s in range(1, SLOTS) if s not in _slots), None)
    if slot is None:
        raise DatapathError(f"{SLOTS - 1} classifiers already attached; raise "
                            "TAILCUT_CLASS_SLOTS in ebpf/classifier.h")
    table = _program.table(COUNTS_MAP)
    for level in range(LEVELS + 1):
        del table[table.Key(slot * (LEVELS + 1) + level)]  # BCC zeroes per-CPU entries
    _slots.add(slot)
    return _program, slot


def _release(slot: int) -> None:
    global _program
    _slots.discard(slot)
    if not _slots and _program is not None:
        _program.close()
        _program = None


def _has_clsact(ipr: IPRoute, index: int) -> bool:
    return any(q.get_attr("TCA_KIND") == "clsact" for q in ipr.get_qdiscs(index))


def _filters_left(ipr: IPRoute, index: int) -> int:
    return sum(1 for parent in (EGRESS, "ffff:fff2")
               for f in ipr.get_filters(index, parent=parent) if f["handle"])


class AttachedClassifier:
    """The classifier on the egress of one interface; counts() tells what it saw."""

    def __init__(self, netns_name: str, ifname: str, ifindex: int, slot: int) -> None:
        self.netns = netns_name
        self.ifname = ifname
        self.ifindex = ifindex
        self.slot = slot
        self._final: Optional[dict[Optional[int], tuple[int, int]]] = None

    def __repr__(self) -> str:
        return f"AttachedClassifier({self.netns}:{self.ifname} slot={self.slot})"

    def counts(self) -> dict[Optional[int], tuple[int, int]]:
        """(packets, bytes) per priority level since attach; key None = untagged."""
        if self._final is not None:
            return self._final
        with _lock:
            assert _program is not None
            table = _program.table(COUNTS_MAP)
            out: dict[Optional[int], tuple[int, int]] = {}
            for level in range(LEVELS + 1):
                per_cpu = table[table.Key(self.slot * (LEVELS + 1) + level)]
                out[level if level < LEVELS else None] = (
                    sum(int(c.packets) for c in per_cpu), sum(int(c.bytes) for c in per_cpu))
            return out

    def detach(self) -> None:
        """Remove the filter (and clsact if we added it and it is now empty). Harmless
        twice, and after the namespace or interface is gone."""
        if self._final is not None:
            return
        self._final = self.counts()
        key = (self.netns, self.ifindex)
        try:
            try:
                ipr = netns.ipr(self.netns)
            except NetError:
                with _lock:
                    _owned_clsact.discard(key)
                return
            with ipr:
                try:
                    ipr.tc("del-filter", "bpf", self.ifindex, handle=FILTER_HANDLE,
                           parent=EGRESS, prio=FILTER_PRIO)
                except NetlinkError as err:
                    gone = err.code in _GONE or (err.code == errno.EINVAL and
                                                 not _has_clsact(ipr, self.ifindex))
                    if not gone:
                        raise DatapathError(f"cannot remove the classifier from "
                                            f"{self.ifname} in {self.netns}: {err}") from err
                with _lock:
                    if key in _owned_clsact and _has_clsact(ipr, self.ifindex) \
                            and not _filters_left(ipr, self.ifindex):
                        ipr.tc("del", "clsact", self.ifindex)
                    _owned_clsact.discard(key)
        finally:
            with _lock:
                _release(self.slot)

    def __enter__(self) -> "AttachedClassifier":
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()


def attach(netns_name: str, ifname: str) -> AttachedClassifier:
    """Classify every packet leaving `ifname` in namespace `netns_name` by its DSCP."""
    with _lock:
        program, slot = _acquire()
    try:
        with netns.ipr(netns_name) as ipr:
            found = ipr.link_lookup(ifname=ifname)
            if not found:
                raise DatapathError(f"no interface {ifname} in network namespace {netns_name}")
            index = int(found[0])
            with _lock:
                added = not _has_clsact(ipr, index)
                ipr.tc("replace", "clsact", index)
                if added:
                    _owned_clsact.add((netns_name, index))
            try:
                ipr.tc("add-filter", "bpf", index, handle=FILTER_HANDLE, parent=EGRESS,
                       prio=FILTER_PRIO, fd=program.fds[FUNCTION], name=FUNCTION,
                       classid=slot, direct_action=True)
            except NetlinkError as err:
                with _lock:
                    if added and not _filters_left(ipr, index):
                        ipr.tc("del", "clsact", index)
                        _owned_clsact.discard((netns_name, index))
                if err.code == errno.EEXIST:
                    raise DatapathError(
                        f"{ifname} in {netns_name} already has a filter at egress pref "
                        f"{FILTER_PRIO} handle {FILTER_HANDLE} (another classifier?); "
                        "detach it first") from err
                raise DatapathError(f"cannot attach the classifier to {ifname} in "
                                    f"{netns_name}: {err}") from err
    except BaseException:
        with _lock:
            _release(slot)
        raise
    return AttachedClassifier(netns_name, ifname, index, slot)
