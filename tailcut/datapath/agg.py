"""In-network aggregation at one rack's ToR (ebpf/agg.bpf.c): load it for one job and
rack, attach it to the ingress of the rack's ports, read what it counted, detach.

    agg = Aggregator(job=wire.job_id("j"), rack=1, members=[4, 5, 6, 7],
                     elements=92113, address="10.2.0.253", ps_address="10.1.0.1")
    agg.attach("tailcut-j.rack-1", "p1", "worker", worker=4)   # each member's port
    agg.attach("tailcut-j.rack-1", "up", "ps")   # the way to the PS: its FLUSHes
    ...
    agg.stats(); agg.detach()

One program and set of maps per rack: each rack sums its own workers and sends the PS
one sum per slot. Nothing is pinned: the program and maps live while this object (the
runtime, or the node agent) holds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Optional

from tailcut.datapath import aggformat as fmt
from tailcut.datapath.ports import RackProgram
from tailcut.datapath.tor import address_key
from tailcut.errors import DatapathError

PortKind = Literal["worker", "ps"]

STEM = "agg"
FUNCTION = "tailcut_agg"   # the name bpftool shows
FILTER_PRIO = 3            # ingress, after the dropper's 1 and the hot store's 2
_KINDS = {"worker": fmt.const("PORT_WORKER"), "ps": fmt.const("PORT_PS")}


class Aggregator(RackProgram):
    """One rack's sums of one job's gradients."""

    def __init__(self, *, job: int, rack: int, members: Sequence[int], elements: int,
                 address: str, ps_address: str) -> None:
        if not 0 < elements <= fmt.MAX_ELEMENTS:
            raise DatapathError(f"a gradient of {elements} values: the ToR aggregates 1 to "
                                f"{fmt.MAX_ELEMENTS}")
        if not members or any(not 0 <= w < fmt.MAX_WORKERS for w in members):
            raise DatapathError(f"members {list(members)}: the ToR aggregates workers "
                                f"0..{fmt.MAX_WORKERS - 1}, at least one")
        self.job, self.rack, self.members = job, rack, sorted(set(members))
        self.elements, self.address, self.ps_address = elements, address, ps_address
        super().__init__(STEM, FUNCTION, "agg", ports=fmt.const("PORTS"), prio=FILTER_PRIO,
                         reasons=fmt.reasons(), what="ToR aggregation")
        try:
            self._fill()
        except BaseException:
            self.program.close()
            raise

    def _fill(self) -> None:
        ring = fmt.const("RING")
        entries = self.program.table("agg_entries")
        for s in range(fmt.slots(self.elements)):
            for e in range(ring):   # entry e of a slot starts at iteration e, open
                leaf = entries.Leaf()
                leaf.claim, leaf.added = e << 33, 0
                entries[entries.Key(s * ring + e)] = leaf
        config = self.program.table("agg_config")
        leaf = config.Leaf()
        leaf.job, leaf.rack, leaf.elements = self.job, self.rack, self.elements
        leaf.slots = fmt.slots(self.elements)
        leaf.members = sum(1 << w for w in self.members)
        leaf.expected = len(self.members)
        leaf.ps_address = address_key(self.ps_address)
        leaf.address = address_key(self.address)   # last: the program serves from here on
        config[config.Key(0)] = leaf

    def set_next_hop(self, mac: Optional[str]) -> None:
        """Where the bridge sends a finished sum: the PS's MAC (the PS in this rack) or
        the spine's port's (elsewhere); None until it is known (sums are dropped)."""
        raw = bytes(6) if mac is None else bytes.fromhex(mac.replace(":", ""))
        if len(raw) != 6:
            raise DatapathError(f"next hop {mac!r}: not a MAC address")
        config = self.program.table("agg_config")
        with self._lock:
            leaf = config[config.Key(0)]
            for i, b in enumerate(raw):
                leaf.next_hop[i] = b
            config[config.Key(0)] = leaf

    def attach(self, netns_name: str, ifname: str, kind: PortKind,
               worker: Optional[int] = None) -> None:
        """Take ADDs from ``worker`` arriving on ``ifname`` (its port), or the PS's
        FLUSHes (kind "ps": the PS's port, or the uplink when the PS is elsewhere)."""
        if kind == "worker" and worker not in self.members:
            raise DatapathError(f"worker {worker} is not in rack {self.rack}'s group "
                                f"{self.members}")
        mask = 0 if worker is None else 1 << worker
        self._attach(netns_name, ifname, _KINDS[kind], mask)
