"""What the ToR's programs share: one program loaded for a job, its tc ingress filters
on a rack's ports (each filter's classid naming the port's entry in the program's port
table: kind, and which workers may arrive there), its per-CPU counters by reason, and
the detaching. The hot-parameter store (tailcut.datapath.tor) and in-network
aggregation (tailcut.datapath.agg) are RackPrograms."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Optional, Self

from tailcut.datapath import bcc, clsact
from tailcut.errors import DatapathError
from tailcut.net import netns


class RackProgram:
    """A loaded program ``function`` of ebpf/<stem>.bpf.c, serving rack ports; its
    tables ``<prefix>_ports`` and ``<prefix>_stats``; ``what`` names it in errors."""

    def __init__(self, stem: str, function: str, prefix: str, *, ports: int, prio: int,
                 reasons: Sequence[str], what: str) -> None:
        self.function, self.prefix, self.size, self.prio = function, prefix, ports, prio
        self.reasons, self.what = list(reasons), what
        self._lock = threading.Lock()
        # classid (port table index) -> (netns, ifname, ifindex) of each attached port
        self._ports: dict[int, tuple[str, str, int]] = {}
        self._final_stats: Optional[dict[str, int]] = None
        self.program = bcc.load(stem, {function: "sched_cls"})

    def _attach(self, netns_name: str, ifname: str, kind: int, workers: int,
                fill: Optional[Callable[[Any, int], None]] = None) -> None:
        """Run the program on ``ifname``'s ingress in ``netns_name``; its port table
        entry says ``kind`` and the bitmap ``workers``, and what ``fill(leaf,
        ifindex)`` adds (a program whose entries hold more), all before the filter."""
        with self._lock:
            index = next((i for i in range(1, self.size) if i not in self._ports), None)
            if index is None:
                raise DatapathError(f"the {self.what} serves at most {self.size - 1} ports "
                                    f"at once")
            table = self.program.table(f"{self.prefix}_ports")
            try:
                with netns.ipr(netns_name) as ipr:
                    ifindex = clsact.ifindex(ipr, netns_name, ifname)
                    leaf = table.Leaf()
                    leaf.kind, leaf.workers = kind, workers
                    if fill is not None:
                        fill(leaf, ifindex)
                    table[table.Key(index)] = leaf
                    clsact.add_filter(ipr, netns_name, ifname, ifindex, direction="ingress",
                                      prio=self.prio, handle=1,
                                      fd=self.program.fds[self.function], name=self.function,
                                      classid=index, what=self.what)
            except BaseException:
                del table[table.Key(index)]
                raise
            self._ports[index] = (netns_name, ifname, ifindex)

    def release(self, netns_name: str, ifname: str) -> None:
        """Stop serving a port (a pod unwired): its filter removed if the port is still
        there, its entry freed for another. Harmless if it was not served."""
        with self._lock:
            for index, (ns, name, ifindex) in list(self._ports.items()):
                if (ns, name) != (netns_name, ifname):
                    continue
                del self._ports[index]
                table = self.program.table(f"{self.prefix}_ports")
                del table[table.Key(index)]   # an array entry: zeroed, kind 0
                clsact.remove_filter(ns, name, ifindex, direction="ingress", prio=self.prio,
                                     handle=1, what=self.what)

    def stats(self) -> dict[str, int]:
        """Packets per reason since loading (summed over CPUs); kept after detach."""
        if self._final_stats is not None:
            return dict(self._final_stats)
        table = self.program.table(f"{self.prefix}_stats")
        return {name: sum(int(v) for v in table[table.Key(i)])
                for i, name in enumerate(self.reasons)}

    def detach(self) -> None:
        """Remove every filter (harmless if its namespace is gone) and unload. Twice is
        harmless; the counters stay readable. Each step runs even if one before failed."""
        with self._lock:
            if self._final_stats is not None:
                return
            errors = []
            try:
                self._final_stats = self.stats()
            except Exception as err:   # noqa: BLE001 -- the filters must go regardless
                self._final_stats = {}
                errors.append(f"reading the {self.what}'s counters: {err}")
            for netns_name, ifname, ifindex in self._ports.values():
                try:
                    clsact.remove_filter(netns_name, ifname, ifindex, direction="ingress",
                                         prio=self.prio, handle=1, what=self.what)
                except DatapathError as err:
                    errors.append(str(err))
            self._ports.clear()
            self.program.close()
        if errors:
            raise DatapathError("; ".join(errors))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()
