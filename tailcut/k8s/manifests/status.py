"""The TrainingJob status: phases, conditions and results, as the operator writes them.

Follows Kubernetes' API conventions (and Kubeflow training-operator's where they
fit): `conditions` is a list of {type, status, reason, message, lastTransitionTime,
observedGeneration} merged by type, each message at most MESSAGE_MAX_CHARS long;
`observedGeneration` says which spec the status describes (a spec change the operator
does not apply leaves it where it was), and
`replicaStatuses` counts active/succeeded/failed pods per role. `phase` is the one
word `kubectl get` shows: Pending -> Running -> Succeeded | Failed.
"""

import datetime
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

PHASES = ("Pending", "Running", "Succeeded", "Failed")
Phase = Literal["Pending", "Running", "Succeeded", "Failed"]
# Condition types, as Kubeflow's jobs name them. Exactly one of Running, Succeeded and
# Failed is True once the job has started.
CONDITION_TYPES = ("Created", "Running", "Succeeded", "Failed")
# A condition's message is for a person; an API server's or a crashed pod's words can be
# long: the end is cut, with a mark, so status patches stay small (metav1.Condition
# allows 32768; kubectl describe shows a screenful).
MESSAGE_MAX_CHARS = 2048


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True,
                              extra="forbid")


class Condition(_Model):
    type: Literal["Created", "Running", "Succeeded", "Failed"]
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(description="CamelCase word a program can match on")
    message: str = Field(default="", description="what happened, for a person")
    last_transition_time: str = Field(description="RFC 3339 time the status last changed")
    observed_generation: Optional[int] = Field(
        default=None, description="metadata.generation of the spec this condition was "
                                  "set from")


class ReplicaStatus(_Model):
    active: int = 0
    succeeded: int = 0
    failed: int = 0


class BackgroundStatus(_Model):
    """What the operator created for spec.backgroundLoad (tailcut.k8s.manifests.background).
    Nothing is required: pod events and the reconcile write their parts separately."""

    config_map: Optional[str] = None
    servers: list[str] = Field(default_factory=list, description="pods with a flow server")
    clients: list[str] = Field(default_factory=list, description="pods running Locust")
    requests_per_s: Optional[float] = Field(
        default=None, description="background flows per second at scale 1")
    users: Optional[int] = None
    run_time_s: Optional[float] = None
    target_load_factor: Optional[float] = None
    target_link: Optional[str] = None
    locust_stats: Optional[str] = Field(default=None,
                                        description="where Locust's CSV statistics end up")
    pods: Optional[ReplicaStatus] = Field(default=None, description="background pods")
    servers_reported: Optional[int] = Field(
        default=None, description="servers that reported what their interface sent")
    sent_mbit_per_s: Optional[float] = Field(
        default=None, description="what the servers' interfaces sent, summed")
    sent_load_factor: Optional[float] = Field(
        default=None, description="that as a share of the target link's bandwidth")


class FidelityStatus(_Model):
    """A finished run's fidelity verdict (tailcut.fidelity.verdict) and why."""

    verdict: Literal["network-bound", "marginal", "host-bound"]
    reasons: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class QueueDrops(_Model):
    """Packets dropped by full link buffers (not the random loss), as the pods end."""

    # A node agent reports a pod's link ends, and its rack's uplink so far, when it
    # releases the pod (tailcut.k8s.agent); the operator keeps the largest per end.

    total: int = 0
    by_link_end: dict[str, int] = Field(
        default_factory=dict, description="per link end ('rack-0/up', 'worker-1/tc0')")


class RackNode(_Model):
    """The node a rack of the job was placed on (tailcut.k8s.manifests.placement)."""

    node: str
    hostname: str = Field(description="its kubernetes.io/hostname label (the pods' nodeSelector)")
    ip: str = Field(description="its InternalIP: the VXLAN endpoint of its spine")


class Status(_Model):
    phase: Optional[Phase] = None
    observed_generation: Optional[int] = Field(
        default=None, description="metadata.generation of the spec this status describes")
    conditions: list[Condition] = Field(default_factory=list)
    # Written by the operator, before it creates anything, through the status
    # subresource (which a namespace's users are not granted): the node agents build
    # the job's network from these and the spec, nothing from objects in the namespace.
    spec_generation: Optional[int] = Field(
        default=None, description="metadata.generation of the spec the job's pods were "
                                  "made from; the node agents wire pods only while the "
                                  "spec is still that one")
    placement: dict[str, RackNode] = Field(
        default_factory=dict, description="per rack: the node that holds it (empty: no "
                                          "schedulable node was known, every node builds "
                                          "every rack)")
    overlay_id: Optional[int] = Field(
        default=None, ge=1, le=2 ** 24 - 1,
        description="the VXLAN network identifier the operator allocated to the job, "
                    "unique among the cluster's TrainingJobs "
                    "(tailcut.k8s.manifests.overlay_ids): the node agents join the job's "
                    "spines on several nodes with it, accepted only from its nodes")
    queue_memory_bytes: Optional[int] = Field(
        default=None, description="the most kernel memory the queues of the job's links "
                                  "may hold, all nodes together (an estimate: "
                                  "tailcut.k8s.manifests.limits), within its namespace's "
                                  "limit")
    in_network: Optional[str] = Field(
        default=None, description="spec.network.inNetwork resolved once (JSON: each ToR "
                                  "program's addresses, racks and data, e.g. the hot set, "
                                  "tailcut.plan.in_network): what the node agents load")
    replica_statuses: dict[str, ReplicaStatus] = Field(
        default_factory=dict, description="per role (PS, Worker): pod counts")
    backend: Optional[str] = Field(default=None, description="kubernetes or local")
    progress: Optional[str] = Field(default=None, description="e.g. '12/30 epochs'")
    epoch: Optional[int] = None
    jct_seconds: Optional[float] = Field(default=None, description="job completion time")
    accuracy: Optional[float] = Field(default=None, description="final test accuracy")
    loss: Optional[float] = Field(default=None, description="final test loss")
    converged: Optional[bool] = None
    fidelity: Optional[FidelityStatus] = Field(
        default=None, description="whether the run measured the network or the host "
                                  "(docs/fidelity.md): on a cluster from the leader's "
                                  "node's CPU over the training window")
    results_dir: Optional[str] = Field(default=None, description="local backend: results")
    start_time: Optional[str] = None
    completion_time: Optional[str] = None
    message: Optional[str] = None
    network: dict[str, str] = Field(
        default_factory=dict,
        description="per link end ('rack-0/up', 'worker-1/tc0'): the shaping the node "
                    "agent applied there, as network.json records it under tailcut run")
    wiring_errors: dict[str, str] = Field(
        default_factory=dict,
        description="per replica: why a node agent could not wire its pod into the job's "
                    "links (also a WiringFailed event); empty once it could")
    queue_drops: Optional[QueueDrops] = Field(
        default=None, description="tail drops of full link buffers, as network.json's "
                                  "queue_drops under tailcut run")
    background: Optional[BackgroundStatus] = Field(
        default=None, description="spec.backgroundLoad on Kubernetes: pods and statistics")


def now() -> str:
    """The current time as Kubernetes writes it (RFC 3339, seconds, UTC)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def capped(message: str) -> str:
    """`message` cut to MESSAGE_MAX_CHARS, saying that it was."""
    if len(message) <= MESSAGE_MAX_CHARS:
        return message
    mark = " ... (cut)"
    return message[:MESSAGE_MAX_CHARS - len(mark)] + mark


def condition(type_: str, status: bool, reason: str, message: str = "",
              at: Optional[str] = None, generation: Optional[int] = None) -> dict[str, Any]:
    """One condition as a plain dict, ready for a status patch."""
    out: dict[str, Any] = {"type": type_, "status": "True" if status else "False",
                           "reason": reason, "message": capped(message),
                           "lastTransitionTime": at or now()}
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def merge_conditions(old: list[dict[str, Any]], new: list[dict[str, Any]]
                     ) -> list[dict[str, Any]]:
    """Merge by type; keep the old lastTransitionTime when status did not change, so
    a reconcile that changes nothing writes nothing new."""
    by_type = {c["type"]: dict(c) for c in old}
    for c in new:
        prev = by_type.get(c["type"])
        if prev is not None and prev.get("status") == c["status"]:
            c = {**c, "lastTransitionTime": prev.get("lastTransitionTime", c["lastTransitionTime"])}
        by_type[c["type"]] = c
    return [by_type[t] for t in CONDITION_TYPES if t in by_type]


def phase_conditions(phase: str, reason: str, message: str = "",
                     created: Optional[str] = "pods, service and config map created",
                     generation: Optional[int] = None) -> list[dict[str, Any]]:
    """The conditions that go with a phase: Created is True once the job's objects
    exist (`created` says what they are; None: nothing was created, Created is False
    with this reason); exactly one of Running, Succeeded and Failed is True after
    that."""
    if created is None:
        conds = [condition("Created", False, reason, message, generation=generation)]
    else:
        conds = [condition("Created", True, "TrainingJobCreated", created,
                           generation=generation)]
    if phase == "Pending":
        return conds
    for t in ("Running", "Succeeded", "Failed"):
        conds.append(condition(t, t == phase, reason if t == phase else f"Not{phase}",
                               message if t == phase else "", generation=generation))
    return conds
