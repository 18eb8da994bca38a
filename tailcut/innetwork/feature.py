"""The contract of a ToR program (spec.network.inNetwork): what every kind of in-network
work implements, so that both executors (tailcut.runtime.local, tailcut.k8s.agent) set
it up, serve pods, report and tear down without naming it.

A kind is one module of this package with a ``KIND`` (listed in
``tailcut.innetwork.KINDS``):

- ``section(job, topo)``: the role-configuration section it needs from the plan
  (addresses, racks, workers; JSON), None when the job does not ask for it. Pure and
  cheap: tailcut.plan calls it, and only tailcut.plan.
- ``resolve(job, section)``: what costs compute (the hot set: profiling the model), done
  once by `tailcut run` or the operator and handed on as data; the identity for most.
- ``create(job, section, network, racks)``: its programs on these racks (indices)
  of an executor's network, loaded and not yet serving: a ``TorFeature``, or None
  when none of those racks has work for it.

A ``TorFeature`` then serves the racks' uplinks (the traffic of other racks), serves
each pod's port as it is wired and releases it as it is unwired, describes what it
added to which link, summarises its counters (before detach) and detaches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Protocol

from tailcut.net.build import Network
from tailcut.net.topology import Pod, Topology
from tailcut.spec.model import TrainingJob

Section = dict[str, Any]   # JSON: what the roles and the programs read


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
    """One kind of ToR program: how the plan and the executors reach it."""

    name: str
    section: Callable[[TrainingJob, Topology], Optional[Section]]
    create: Callable[[TrainingJob, Section, Network, Optional[Sequence[int]]],
                     Optional[TorFeature]]
    resolve: Callable[[TrainingJob, Section], Section] = lambda job, section: section


# ---- what the per-rack kinds (aggregation, multicast) share ----------------------------

def worker_racks(topo: Topology, address_of: Callable[[int], str]) -> Section:
    """Each rack with workers, the address its ToR program answers at, its workers."""
    racks = []
    for rack in topo.racks:
        workers = sorted(p.index for p in rack.pods if p.role == "worker")
        if workers:
            racks.append({"index": rack.index, "address": address_of(rack.index),
                          "workers": workers})
    return {"racks": racks}


def with_model_length(job: TrainingJob, spec_section: Section) -> Section:
    """`spec_section` with the model's length, "elements" (building the model tells
    it), resolved once as data for the node."""
    from tailcut.ml import models
    ref = job.spec.training.model_ref
    elements = models.create(ref, models.dataset(ref, job.spec.training.seed)).num_params
    return {**spec_section, "elements": elements}


def detach_each(kind: str, programs: dict[int, Any]) -> list[str]:
    """Detach every rack's program; the errors, each named (all are tried)."""
    errors = []
    for program in programs.values():
        try:
            program.detach()
        except Exception as err:   # noqa: BLE001 -- the others must go regardless
            errors.append(f"{kind}, rack {program.rack}: {err}")
    return errors
