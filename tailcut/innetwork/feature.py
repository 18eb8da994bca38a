"""The contract of a ToR program (spec.network.inNetwork): what every kind of in-network
work implements, so that both executors (tailcut.runtime.local, tailcut.k8s.agent) set
it up, serve pods, report and tear down without naming it.

A kind is one module of this package with a ``KIND`` (listed in
``tailcut.innetwork.KINDS``), or a package's own registered in tailcut.spec.tor_kinds
(``tailcut.innetwork.kinds()`` has both), named as its plan in tailcut.innetplan (which
gives its section of the role configurations):

- ``create(job, section, network, racks)``: its programs on these racks (indices)
  of an executor's network, loaded with its resolved section and not yet serving: a
  ``TorFeature``, or None when none of those racks has work for it.

A ``TorFeature`` then serves the racks' uplinks (the traffic of other racks), serves
each pod's port as it is wired and releases it as it is unwired, describes what it
added to which link, summarises its counters (before detach) and detaches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Protocol

from tailcut.innetplan import Section
from tailcut.net.build import Network
from tailcut.net.topology import Pod
from tailcut.spec.model import TrainingJob


class TorFeature(Protocol):
    """One job's programs of one kind on the racks an executor built."""

    name: str   # its key in network.json, e.g. "aggregation"

    def serve_uplinks(self, network: Network) -> None:
        """Take the traffic of other racks: the rack's uplink and the spine's
        neighbour entries."""

    def serve_pods(self, network: Network, pods: Sequence[Pod]) -> None:
        """Serve these pods' ports (and pin the program's address in the pods)."""

    def release_pod(self, network: Network, pod: Pod) -> None:
        """The pod was unwired: free what its port held. Harmless if not served."""

    def links(self) -> dict[str, str]:
        """'<netns>/<ifname>' -> what this feature added there, for the applied record."""

    def describe(self) -> str:
        """One line for the run's progress."""

    def summary(self) -> dict[str, Any]:
        """Its counters, for network.json (call before detach)."""

    def detach(self) -> list[str]:
        """Remove every filter and unload; the errors (each program is tried)."""


@dataclass(frozen=True)
class Kind:
    """One kind of ToR program: how the executors reach it."""

    name: str   # its tailcut.innetplan.KindPlan's
    create: Callable[[TrainingJob, Section, Network, Optional[Sequence[int]]],
                     Optional[TorFeature]]


def detach_each(kind: str, programs: dict[int, Any]) -> list[str]:
    """Detach every rack's program; the errors, each named (all are tried)."""
    errors = []
    for program in programs.values():
        try:
            program.detach()
        except Exception as err:   # noqa: BLE001 -- the others must go regardless
            errors.append(f"{kind}, rack {program.rack}: {err}")
    return errors
