"""The ToR's hot-parameter store of ebpf/tor.bpf.c: load it for one job, attach it to
the ingress of the rack's ports, read what it counted, detach.

    store = tor.Store(job=wire.job_id("j"), workers=8, address="10.1.0.250",
                      initial=params[hot])           # one program and set of maps a job
    store.attach("tailcut-j.rack-0", "p1", "worker", workers=[0])
    store.attach("tailcut-j.rack-0", "p0", "ps")
    store.attach("tailcut-j.rack-0", "up", "uplink", workers=[4, 5, 6, 7])  # other racks
    ...
    store.stats(); store.values(); store.detach()

Each port's filter carries a classid naming the port's entry in tor_ports: which
workers may arrive on it (a worker's port: that worker; the uplink: the workers of the
other racks), so no pod can write as a worker of another port.
Nothing is pinned: the program and maps live while this object (the runtime, or the
node agent) holds them, and go with the filters when the job's namespaces go.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Sequence
from typing import Literal

import numpy as np

from tailcut.datapath import torformat as fmt
from tailcut.datapath.ports import RackProgram
from tailcut.errors import DatapathError

PortKind = Literal["worker", "ps", "uplink"]

STEM = "tor"
FUNCTION = "tailcut_tor"   # the name bpftool shows
FILTER_PRIO = 2            # ingress, after the loss dropper (1); aggregation's is 3
_KINDS = {"worker": fmt.const("PORT_WORKER"), "ps": fmt.const("PORT_PS"),
          "uplink": fmt.const("PORT_UPLINK")}


def address_key(address: str) -> int:
    """The IPv4 address as the program compares it: the packet's bytes read as a u32."""
    return int.from_bytes(socket.inet_aton(address), sys.byteorder)


class Store(RackProgram):
    """One job's hot parameters in the ToR."""

    def __init__(self, *, job: int, workers: int, address: str,
                 initial: np.ndarray) -> None:
        elements = len(initial)
        if not 0 < elements <= fmt.MAX_ELEMENTS:
            raise DatapathError(f"{elements} hot parameters: the ToR holds 1 to "
                                f"{fmt.MAX_ELEMENTS}")
        if not 0 < workers <= fmt.const("MAX_WORKERS"):
            raise DatapathError(f"{workers} workers: the ToR's claim words hold 1 to "
                                f"{fmt.const('MAX_WORKERS')}")
        self.job, self.workers, self.address, self.elements = job, workers, address, elements
        super().__init__(STEM, FUNCTION, "tor", ports=fmt.const("PORTS"), prio=FILTER_PRIO,
                         reasons=fmt.reasons(), what="ToR store")
        try:
            self._fill(initial)
        except BaseException:
            self.program.close()
            raise

    def _fill(self, initial: np.ndarray) -> None:
        fixed, saturated = fmt.to_fixed(initial)
        if saturated:
            raise DatapathError(f"{saturated} initial hot values are outside Q8.24's +-128")
        n_slots = fmt.slots(self.elements)
        vals = self.program.table("tor_vals")
        for s in range(n_slots):
            leaf = vals.Leaf()
            chunk = fixed[s * fmt.STRIDE:(s + 1) * fmt.STRIDE]
            for i, v in enumerate(chunk.tolist()):
                leaf.v[i] = v
            vals[vals.Key(s)] = leaf   # iteration 0's values are at [0 * SLOTS + slot]
        config = self.program.table("tor_config")
        leaf = config.Leaf()
        leaf.job, leaf.workers, leaf.elements, leaf.slots = (
            self.job, self.workers, self.elements, n_slots)
        leaf.address = address_key(self.address)   # last: the program serves from here on
        config[config.Key(0)] = leaf

    def attach(self, netns_name: str, ifname: str, kind: PortKind,
               workers: Sequence[int] = ()) -> None:
        """Serve requests arriving on ``ifname`` (a rack port) in ``netns_name`` from
        these workers (a "ps" port: from the PS only)."""
        mask = 0
        for w in workers:
            if not 0 <= w < self.workers:
                raise DatapathError(f"worker {w}: the job has workers 0..{self.workers - 1}")
            mask |= 1 << w
        self._attach(netns_name, ifname, _KINDS[kind], mask)

    def iterations(self) -> list[int]:
        """Each slot's current iteration."""
        table = self.program.table("tor_slots")
        return [int(table[table.Key(s)].iteration) for s in range(fmt.slots(self.elements))]

    def values(self) -> np.ndarray:
        """The hot values of each slot's current iteration (float32), read from the maps."""
        vals = self.program.table("tor_vals")
        out = np.empty(self.elements, dtype=np.int64)
        for s, it in enumerate(self.iterations()):
            leaf = vals[vals.Key((it & 1) * fmt.const("SLOTS") + s)]
            n = fmt.slot_length(self.elements, s)
            out[s * fmt.STRIDE:s * fmt.STRIDE + n] = np.ctypeslib.as_array(leaf.v)[:n]
        return (out / fmt.SCALE).astype(np.float32)

    def counts(self) -> np.ndarray:
        """Pushes that changed each hot element."""
        table = self.program.table("tor_counts")
        out = np.empty(self.elements, dtype=np.int64)
        for s in range(fmt.slots(self.elements)):
            n = fmt.slot_length(self.elements, s)
            out[s * fmt.STRIDE:s * fmt.STRIDE + n] = np.ctypeslib.as_array(
                table[table.Key(s)].c)[:n]
        return out
