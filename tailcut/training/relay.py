"""Who sends what to whom in the transpose all-reduce (training.transpose), rack by rack.

Rank k owns shard k. A plain transpose has every rank send every owner its piece and
every owner send every rank its shard, so the ranks of one rack send their pieces of a
shard owned in another rack across their uplink once each: with two ranks per rack,
two vectors each way per iteration, where a ring takes 1.5. Here one rank of each rack
relays each shard owned outside it (``relay``), so each shard crosses between two
racks once each way (with two racks: one vector each way per uplink):

    1 gather    to each rack peer t: my pieces of the shards t handles
                (``handles``: t's own shard, and those t relays)
    2 reduce    as a relay, to the owner of each shard I relay: my rack's sum of it
    3 broadcast as an owner, to the relay of my shard in every other rack: my shard
    4 scatter   to each rack peer: the shards I handle (mine, and those I relay)

All ranks together send what the plain transpose sends, 2(N-1) shards each way; each
rank 2(N-1)/N of the vector where a rack's size divides the number of shards owned
outside it (else a rank relays one shard more than its rack peers). One message goes
to a rack peer per step (pieces for the same peer go as one message), so four racks of
one rank, or one rack of all of them, are the plain transpose. Racks are what
``spec.network.placement`` says (``RoleConfig.rank_racks``); none given: one rack.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Racks:
    """The ranks' racks: ``rack_of[r]`` is rank r's rack (any hashable label)."""

    rack_of: tuple[int, ...]

    @classmethod
    def of(cls, world: int, rank_racks: Sequence[int] | None) -> Racks:
        return cls(tuple(rank_racks) if rank_racks is not None else (0,) * world)

    def members(self, rank: int) -> list[int]:
        """The ranks in ``rank``'s rack, ``rank`` included, in order."""
        return [r for r, rack in enumerate(self.rack_of) if rack == self.rack_of[rank]]

    def peers(self, rank: int) -> list[int]:
        return [r for r in self.members(rank) if r != rank]

    def relay(self, rank: int, shard: int) -> int:
        """The rank of ``rank``'s rack that relays ``shard`` (owned in another rack):
        the rack's ranks take the shards owned outside it in turn (by position, not
        by shard number, which would give one rank of interleaved racks them all)."""
        members = self.members(rank)
        remote = [k for k, rack in enumerate(self.rack_of) if rack != self.rack_of[rank]]
        return members[remote.index(shard) % len(members)]

    def relayed(self, rank: int) -> list[int]:
        """The shards ``rank`` relays for its rack."""
        return [k for k, rack in enumerate(self.rack_of)
                if rack != self.rack_of[rank] and self.relay(rank, k) == rank]

    def handles(self, rank: int) -> list[int]:
        """What ``rank`` gathers from its rack peers and scatters back to them: its own
        shard and the shards it relays, in shard order."""
        return sorted([rank, *self.relayed(rank)])

    def relays_of(self, shard: int) -> list[int]:
        """The ranks that send the owner of ``shard`` their rack's sum (and get its
        shard back): one in every other rack."""
        others = sorted({rack for rack in self.rack_of if rack != self.rack_of[shard]})
        firsts = [self.rack_of.index(rack) for rack in others]
        return [self.relay(first, shard) for first in firsts]

    def size(self, rank: int) -> int:
        return len(self.members(rank))

    def largest(self, shard_sizes: Sequence[int]) -> int:
        """The most values any message of the plan holds: one shard (a relay's sum, an
        owner's PARAMS), or every shard a rank handles (a gather to it or its scatter,
        which only a rank with rack peers gets or sends)."""
        gathers = [sum(shard_sizes[k] for k in self.handles(r))
                   for r in range(len(self.rack_of)) if self.peers(r)]
        return max([*shard_sizes, *gathers])
