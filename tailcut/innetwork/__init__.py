"""Work the ToR does for a job in BPF (spec.network.inNetwork), one module per kind of
program, each implementing the contract of ``feature`` and listed in ``KINDS`` (the
kinds of tailcut.innetplan, which plans what each is loaded with); ``kinds()`` adds
those installed packages register (tailcut.spec.tor_kinds). Both
executors go through the functions here and never name a kind: `tailcut run` starts
every enabled feature on all racks at once (``start``); the node agent creates them
for the racks of its node (``create``), serves the uplinks, then each pod's port as it
is wired."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from tailcut.innetplan import Sections as Sections   # re-exported
from tailcut.innetwork import aggregation, hotstore, multicast
from tailcut.innetwork.feature import Kind
from tailcut.innetwork.feature import TorFeature as TorFeature   # re-exported
from tailcut.net.build import Network
from tailcut.net.topology import Pod
from tailcut.spec import tor_kinds
from tailcut.spec.model import TrainingJob

KINDS: tuple[Kind, ...] = (hotstore.KIND, aggregation.KIND, multicast.KIND)


def kinds() -> tuple[Kind, ...]:
    """The programs of every registered ToR kind (tailcut.spec.tor_kinds), tailcut's
    first."""
    found: tuple[Kind, ...] = tor_kinds.parts("program", Kind)
    return found


def create(job: TrainingJob, sections: Sections, network: Network,
           racks: Optional[Sequence[int]] = None) -> list[TorFeature]:
    """The job's enabled features on these racks (default all), loaded, serving
    nothing yet. All or nothing."""
    made: list[TorFeature] = []
    try:
        for kind in kinds():
            if kind.name in sections:
                feature = kind.create(job, sections[kind.name], network, racks)
                if feature is not None:
                    made.append(feature)
    except BaseException:
        detach(made)
        raise
    return made


def start(job: TrainingJob, sections: Sections, network: Network) -> list[TorFeature]:
    """`tailcut run`: every feature serving every rack's uplink and every pod's port."""
    made = create(job, sections, network)
    try:
        for feature in made:
            feature.serve_uplinks(network)
            feature.serve_pods(network, network.topology.pods)
    except BaseException:
        detach(made)
        raise
    return made


def serve_pod(features: Sequence[TorFeature], network: Network, pod: Pod) -> None:
    """Every feature serving one newly wired pod's port; on failure the ports already
    served are released again."""
    try:
        for feature in features:
            feature.serve_pods(network, [pod])
    except BaseException:
        release_pod(features, network, pod)
        raise


def release_pod(features: Sequence[TorFeature], network: Network, pod: Pod) -> None:
    """Every feature releasing the pod's port; each is tried, the first error raised."""
    first: Optional[BaseException] = None
    for feature in features:
        try:
            feature.release_pod(network, pod)
        except Exception as err:   # noqa: BLE001 -- the others must release too
            first = first or err
    if first is not None:
        raise first


def detach(features: Sequence[TorFeature]) -> list[str]:
    """Detach every feature, last first; the errors."""
    errors: list[str] = []
    for feature in reversed(features):
        errors += feature.detach()
    return errors
