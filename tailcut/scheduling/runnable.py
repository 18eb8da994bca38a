"""Whether `tailcut run` and the pods can honour a job's scheduling policy, checked
before anything is built. Pure: tailcut.plan and the operator's manifests ask it without
loading what enforces the policy (tailcut.scheduling.enforce: netlink, BCC)."""

from __future__ import annotations

from typing import Optional

from tailcut.errors import SpecError
from tailcut.spec import transport_kinds
from tailcut.spec.model import Scheduling, TrainingJob


def check_runnable(scheduling: Scheduling, job: Optional[TrainingJob] = None) -> None:
    """Refuse, before anything is built, what `tailcut run` cannot honour: `coflow`
    over anything but tcp (only TCP connections are paced per flow), `cadentflow` over
    app-drop (tcp, udp and bounded-loss send a message as tagged per-tensor parts,
    app-drop does not), and either with aggregators or a PS replica (they forward
    whole vectors)."""
    if job is not None and scheduling.policy == "coflow":
        _check_coflow(job)
    if scheduling.policy != "cadentflow" or job is None:
        return
    if not transport_kinds.get(job.spec.transport.type).tags_flows:
        tagging = ", ".join(transport_kinds.with_trait("tags_flows"))
        raise SpecError(
            f"spec.scheduling.policy='cadentflow' with spec.transport.type="
            f"{job.spec.transport.type!r}: only the {tagging} transports "
            "tag their messages per tensor so far; use one of them or policy fair")
    if job.spec.replicas.aggregators or job.spec.replicas.ps_replica:
        raise SpecError(
            "spec.scheduling.policy='cadentflow' with spec.replicas.aggregators or "
            "spec.replicas.psReplica: aggregators and the replica forward whole vectors, "
            "untagged; run cadentflow without them")


def _check_coflow(job: TrainingJob) -> None:
    kind = job.spec.transport.type
    traits = transport_kinds.get(kind)
    if not traits.paces_flows:
        why = ("app-drop sends its masked frames on its own path, which does not take "
               "the per-flow rate yet" if kind == "app-drop" else
               f"{kind} paces each role at one rate (spec.transport.rateMbit), not each "
               "flow" if traits.datagrams else f"{kind} does not pace each flow")
        raise SpecError(
            f"spec.scheduling.policy='coflow' with spec.transport.type={kind!r}: only "
            f"the tcp transport paces each flow at its MADD rate (SO_MAX_PACING_RATE per "
            f"connection); {why}. Use transport tcp or policy fair")
    if job.spec.replicas.aggregators or job.spec.replicas.ps_replica:
        raise SpecError(
            "spec.scheduling.policy='coflow' with spec.replicas.aggregators or "
            "spec.replicas.psReplica: their flows are not in the coflows the PS and "
            "workers pace; run coflow without them")
