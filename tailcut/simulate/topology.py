"""Fabrics for the flow-level simulator: nodes, directed links with capacities, paths.

Every node has a NIC with an up link (node -> switch) and a down link (switch ->
node). A star is one non-blocking switch (the paper's single-application setting).
Racks add one uplink pair per rack between its ToR and the core; a path that leaves
its rack crosses the rack's up link and the other rack's down link. Link ids:

    0 .. n-1          node i's NIC, up          (capacity nic_bit, or node_nic_bit[i])
    n .. 2n-1         node i's NIC, down

A flow from a node to itself (a worker and its PS colocated) crosses no link: the
simulator delivers it when it is released.
    2n + 2r, 2n+2r+1  rack r's uplink, up / down (capacity uplink_bit[r])
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Fabric:
    """Nodes on racks joined by a core; what the simulator routes flows over."""

    nic_bit: float
    rack_of: tuple[int, ...]                  # node -> rack
    uplink_bit: tuple[float, ...] = field(default=())  # per rack; () = one rack, no core
    # Per node NIC rates (heterogeneous NICs); () = every NIC at nic_bit.
    node_nic_bit: tuple[float, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.node_nic_bit and len(self.node_nic_bit) != len(self.rack_of):
            raise ValueError(f"node_nic_bit has {len(self.node_nic_bit)} rates for "
                             f"{len(self.rack_of)} nodes: give one per node or none")

    def nic_of(self, node: int) -> float:
        """Node `node`'s NIC rate in bit/s."""
        return self.node_nic_bit[node] if self.node_nic_bit else self.nic_bit

    @property
    def nodes(self) -> int:
        return len(self.rack_of)

    @property
    def links(self) -> int:
        return 2 * self.nodes + 2 * len(self.uplink_bit)

    def capacities_byte(self) -> np.ndarray:
        """Capacity of every link in bytes per second."""
        n = self.nodes
        caps = np.empty(self.links)
        caps[:n] = [self.nic_of(i) / 8 for i in range(n)]
        caps[n:2 * n] = caps[:n]
        for r, bit in enumerate(self.uplink_bit):
            caps[2 * n + 2 * r] = caps[2 * n + 2 * r + 1] = bit / 8
        return caps

    def path(self, src: int, dst: int) -> tuple[int, ...]:
        n = self.nodes
        rs, rd = self.rack_of[src], self.rack_of[dst]
        if rs == rd or not self.uplink_bit:
            return (src, n + dst)
        return (src, 2 * n + 2 * rs, 2 * n + 2 * rd + 1, n + dst)

    def describe(self) -> str:
        racks = max(self.rack_of) + 1 if self.rack_of else 0
        ups = ", ".join(f"{b / 1e9:g}" for b in self.uplink_bit)
        core = f"; rack uplinks {ups} Gbit/s" if self.uplink_bit else ""
        nics = (", ".join(f"{b / 1e9:g}" for b in self.node_nic_bit) if self.node_nic_bit
                else f"{self.nic_bit / 1e9:g}")
        return f"{self.nodes} nodes in {racks} rack(s), NIC {nics} Gbit/s{core}"


def star(nodes: int, nic_bit: float) -> Fabric:
    """`nodes` hosts on one non-blocking switch."""
    return Fabric(nic_bit, tuple([0] * nodes))


def shared_racks(nic_bit: float, per_rack: int = 12, shared_uplink_nics: int = 6) -> Fabric:
    """The paper's Fig. 4: three racks of `per_rack` servers; racks 0 and 1 have a
    non-blocking uplink, rack 2 (shared by both jobs) an uplink of
    `shared_uplink_nics` NICs (60 Gbit/s at 10 Gbit/s NICs: a fair share of 30 each,
    where each job's 4 servers there need 40)."""
    rack_of = tuple(r for r in range(3) for _ in range(per_rack))
    ups = (per_rack * nic_bit, per_rack * nic_bit, shared_uplink_nics * nic_bit)
    return Fabric(nic_bit, rack_of, ups)
