"""CadentFlow tags to HTB priority classes by the tc program ebpf/classifier.bpf.c.

    c = classifier.attach("tailcut-cf.ps-0", "eth0")    # clsact egress, pref 2
    ...
    c.counts()       # {level: (packets, bytes)}, level None = untagged
    c.detach()

A sender tags a flow with IP_TOS = dscp_of(level) << 2; the program maps DSCP
TAILCUT_DSCP_BASE + level to skb->priority = 1:(0x20 + level), and HTB (built by
tailcut.net.tc.apply_priorities) sends the packet to that class. What attach()
adds, as `tc filter show dev eth0 egress` shows it:

    filter protocol all pref 2 bpf chain 0 handle 0x1 flowid :1 tailcut_classify ...

The loss dropper sits at pref 1 of the same hook and returns TC_ACT_UNSPEC for the
packets it keeps, so every surviving packet reaches the classifier. The program is
compiled once per process and shared by every interface; the filter's classid is the
attachment's counter slot (see ebpf/classifier.h). detach() deletes the filter, and
the clsact qdisc too if this module added it and no filter is left on it.
"""

from __future__ import annotations

import threading
from typing import Optional

from tailcut.datapath import bcc, clsact
from tailcut.errors import DatapathError
from tailcut.net import netns

STEM = "classifier"
FUNCTION = "tailcut_classify"
COUNTS_MAP = "class_counts"
FILTER_PRIO = 2     # after the loss dropper (pref 1)
FILTER_HANDLE = 1
HTB_MAJOR = 1       # tailcut.net.shaping's root qdisc is 1:
LEVELS = 8          # TAILCUT_PRIORITY_LEVELS
DSCP_BASE = 8       # TAILCUT_DSCP_BASE
CLASS_BASE = 0x20   # TAILCUT_CLASS_BASE
SLOTS = 256         # TAILCUT_CLASS_SLOTS

_lock = threading.Lock()
_program: Optional[bcc.Program] = None
_slots: set[int] = set()


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
        try:
            clsact.remove_filter(self.netns, self.ifname, self.ifindex, direction="egress",
                                 prio=FILTER_PRIO, handle=FILTER_HANDLE, what="classifier")
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
            index = clsact.ifindex(ipr, netns_name, ifname)
            clsact.add_filter(ipr, netns_name, ifname, index, direction="egress",
                              prio=FILTER_PRIO, handle=FILTER_HANDLE,
                              fd=program.fds[FUNCTION], name=FUNCTION, classid=slot,
                              what="classifier")
    except BaseException:
        with _lock:
            _release(slot)
        raise
    return AttachedClassifier(netns_name, ifname, index, slot)
