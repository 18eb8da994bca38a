"""Multicast of the PS's parameters at one rack's ToR (ebpf/mcast.bpf.c): load it for
one job and rack, attach it to the ingress of the way from the PS and of the rack's
workers' ports, read what it counted, detach.

    rep = Replicator(job=wire.job_id("j"), rack=1, elements=92113, address="10.2.0.252")
    rep.attach("tailcut-j.rack-1", "up", "ps")          # the way from the PS
    rep.attach("tailcut-j.rack-1", "p1", "worker", worker=4,
               mac="02:..", ip="10.2.0.3")               # where worker 4's copies go
    ...
    rep.stats(); rep.copies(); rep.detach()

A worker's port gets the filter too (a PARAMS sent from it is refused, counted
wrong_port) and an entry saying where its copies go. One program per rack; nothing is
pinned: the program and maps live while this object (the runtime, or the node agent)
holds them.
"""

from __future__ import annotations

import socket
import sys
from typing import Any, Literal, Optional

from tailcut.datapath import mcastformat as fmt
from tailcut.datapath.ports import RackProgram
from tailcut.errors import DatapathError

PortKind = Literal["worker", "ps"]

STEM = "mcast"
FUNCTION = "tailcut_mcast"   # the name bpftool shows
FILTER_PRIO = 4              # ingress, after the dropper's 1, hot store's 2, aggregation's 3
_KINDS = {"worker": fmt.const("PORT_WORKER"), "ps": fmt.const("PORT_PS")}
MAX_WORKERS = 256            # the header's worker byte


def _address_key(address: str) -> int:
    """The IPv4 address as the program compares it: the packet's bytes read as a u32."""
    return int.from_bytes(socket.inet_aton(address), sys.byteorder)


class Replicator(RackProgram):
    """One rack's copies of one job's parameters."""

    def __init__(self, *, job: int, rack: int, elements: int, address: str) -> None:
        if not 0 < elements <= fmt.MAX_ELEMENTS:
            raise DatapathError(f"a model of {elements} values: the ToR multicasts 1 to "
                                f"{fmt.MAX_ELEMENTS}")
        self.job, self.rack, self.elements, self.address = job, rack, elements, address
        self.workers: dict[int, int] = {}   # port table index -> worker
        super().__init__(STEM, FUNCTION, "mcast", ports=fmt.const("PORTS"),
                         prio=FILTER_PRIO, reasons=fmt.reasons(), what="ToR multicast")
        try:
            config = self.program.table("mcast_config")
            leaf = config.Leaf()
            leaf.job, leaf.elements, leaf.slots, leaf.rack = (
                job, elements, fmt.slots(elements), rack)
            leaf.address = _address_key(address)   # last: the program serves from here on
            config[config.Key(0)] = leaf
        except BaseException:
            self.program.close()
            raise

    def attach(self, netns_name: str, ifname: str, kind: PortKind,
               worker: Optional[int] = None, mac: str = "", ip: str = "") -> None:
        """Take the PS's PARAMS arriving on ``ifname`` (kind "ps": the PS's port, or the
        uplink when the PS is elsewhere), or send worker ``worker``'s copies out of
        ``ifname`` (its port), addressed to its ``mac`` and ``ip``."""
        fill = None
        if kind == "worker":
            if worker is None or not 0 <= worker < MAX_WORKERS:
                raise DatapathError(f"worker {worker}: a worker's port needs its index, "
                                    f"0..{MAX_WORKERS - 1}")
            raw = bytes.fromhex(mac.replace(":", ""))
            if len(raw) != 6:
                raise DatapathError(f"worker {worker}'s MAC {mac!r}: not a MAC address")
            dst = _address_key(ip)

            def fill(leaf: Any, ifindex: int) -> None:
                leaf.ifindex, leaf.ip, leaf.worker = ifindex, dst, worker
                for i, b in enumerate(raw):
                    leaf.mac[i] = b
        mask = 0 if worker is None else 1 << (worker % 32)
        self._attach(netns_name, ifname, _KINDS[kind], mask, fill)

    def copies(self) -> dict[str, int]:
        """Copies sent so far, by '<netns>/<ifname>' of the port they went out of."""
        table = self.program.table("mcast_copies")
        with self._lock:
            ports = dict(self._ports)
        return {f"{ns}/{name}": sum(int(v) for v in table[table.Key(index)])
                for index, (ns, name, _) in sorted(ports.items())}
