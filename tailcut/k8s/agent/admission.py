"""Which pods the node agent acts for, and what it builds them from.

The agent is privileged on its node (namespaces, veths, tc, BPF, a VXLAN from the
node's address), so a label or an annotation, which anyone who may create a pod can
set, must not be enough to make it act. It wires a pod only when

  1. the pod's controller (its ownerReference with controller: true) is a TrainingJob:
     the operator creates every pod of a job itself, so the chain is one link long;
  2. that TrainingJob exists in the pod's namespace with the UID the reference names
     (a pod of a deleted job, or of an earlier job of the same name, is not wired);
  3. the pod carries the job's name and is named as the operator names it
     (<job>-<replica>, the replica one of the job's plan);
  4. the operator has recorded, in the job's status, the spec generation the pods were
     made from and the racks' placement (the status subresource, which a namespace's
     users are not granted), and the spec is still that generation.

Everything the agent builds then comes from that TrainingJob: the spec from its
.spec, the nodes of its racks (and so the VXLAN peers) from its .status.placement, the
VXLAN's id from its .status.overlayId (tailcut.k8s.manifests.overlay_ids).
No config map and no annotation is read: the agent has no right to read config maps.

Kubernetes does not authenticate ownerReferences: someone who may create pods in the
job's namespace and read the job can make a pod that claims it. Such a pod must still
take a name of the job's plan that no pod of the job holds, and then gets that
replica's place in that job's own network, nothing beyond it (docs/kubernetes.md).

Pure: `admit` takes the pod as the client's watch yields it and the TrainingJob as the
API returns it, so it is tested against a real API server's objects.
"""

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from tailcut import spec
from tailcut.errors import SpecError, TailcutError
from tailcut.k8s.manifests import crd, overlay_ids, placement, policy, resources
from tailcut.net import topology
from tailcut.spec.model import TrainingJob


class Refused(TailcutError):
    """The agent does not act for this pod; the message names the pod and why. Only
    logged: nothing shows that the pod is its job's (its controller reference does not
    name an existing TrainingJob of that UID)."""


class NotYet(Refused):
    """Not wired yet: the operator has not recorded all the agent needs in the job's
    status; the pod's next event retries. Logged."""


class Denied(Refused):
    """A pod of an existing TrainingJob that no retry will wire (its spec changed, its
    status or the pod itself is not what the operator writes, its network namespace
    is the node's). Recorded on the pod (resources.ANNOTATION_REFUSED), so the
    operator fails the job at once with an event and its Failed condition, instead of
    the pod waiting out its 120 s for tc0."""


@dataclass(frozen=True)
class Controller:
    """The TrainingJob a pod's ownerReference says controls it."""

    name: str
    uid: str


@dataclass(frozen=True)
class Admitted:
    """A pod the agent wires, and what it builds for it."""

    job: TrainingJob
    racks_at: placement.Placement   # rack -> node; empty: every rack on every node
    job_uid: str   # which incarnation of the job: one deleted and re-created has another
    replica: str   # ps-0, worker-3, bg-server-0: the pod's name in the plan
    # spec.network.inNetwork as the operator resolved it (status.inNetwork): the ToR
    # programs' sections, the hot set included; empty without inNetwork
    tor: dict[str, Any] = field(default_factory=dict)
    # the VNI the operator allocated to the job (status.overlayId); None: not recorded
    overlay_id: Optional[int] = None


def where(pod: Any) -> str:
    return f"{pod.metadata.namespace}/{pod.metadata.name}"


def controller(pod: Any) -> Controller:
    """The TrainingJob the pod's controller reference names, or Refused."""
    refs = [r for r in pod.metadata.owner_references or [] if r.controller]
    if not refs:
        raise Refused(f"{where(pod)}: not wired: it has no controller (the agent wires "
                      "only pods a TrainingJob controls)")
    ref = refs[0]
    group = (ref.api_version or "").split("/")[0]
    if ref.kind != "TrainingJob" or group != crd.GROUP:
        raise Refused(f"{where(pod)}: not wired: its controller is {ref.kind} {ref.name} "
                      f"({ref.api_version}), not a TrainingJob")
    return Controller(name=ref.name, uid=ref.uid)


def admit(pod: Any, training_job: Optional[Mapping[str, Any]]) -> Admitted:
    """The job and placement to wire `pod` with, or Refused naming the check that
    failed. `training_job` is the TrainingJob its controller reference names, as the
    API server returns it (None: there is none of that name)."""
    ref = controller(pod)
    namespace = pod.metadata.namespace
    if training_job is None:
        raise Refused(f"{where(pod)}: not wired: its controller, TrainingJob "
                      f"{namespace}/{ref.name}, does not exist")
    meta = training_job.get("metadata") or {}
    if meta.get("uid") != ref.uid:
        raise Refused(f"{where(pod)}: not wired: TrainingJob {namespace}/{ref.name} has "
                      f"uid {meta.get('uid')}, not {ref.uid} as the pod's controller "
                      "reference says (a pod of a deleted job of that name)")
    labels = pod.metadata.labels or {}
    if labels.get(resources.LABEL_JOB) != ref.name:
        raise Refused(f"{where(pod)}: not wired: label {resources.LABEL_JOB}="
                      f"{labels.get(resources.LABEL_JOB)!r} does not name its controller "
                      f"{ref.name}")
    status = training_job.get("status") or {}
    recorded = status.get("specGeneration")
    if recorded is None:
        raise NotYet(f"{where(pod)}: not wired yet: the operator has not recorded "
                     f"TrainingJob {namespace}/{ref.name}'s placement in its status "
                     "(status.specGeneration); the pod's next event retries")
    if meta.get("generation") != recorded:
        raise Denied(f"{where(pod)}: not wired: TrainingJob {namespace}/{ref.name}'s "
                     f"spec changed (generation {meta.get('generation')}) after its pods "
                     f"were made from generation {recorded}; the change is not applied: "
                     "delete and re-create the TrainingJob")
    try:
        job = spec.from_dict({"apiVersion": training_job.get("apiVersion"),
                              "kind": training_job.get("kind"),
                              "metadata": {"name": ref.name},
                              "spec": training_job.get("spec") or {}},
                             source=f"TrainingJob {namespace}/{ref.name}",
                             import_modules=False)   # a tenant's code runs in its pods
        policy.check_enforceable(job)   # the operator refused these already
    except SpecError as err:
        raise Denied(f"{where(pod)}: not wired: {err}") from err
    replica = labels.get(resources.LABEL_REPLICA)
    if replica not in {p.name for p in topology.plan(job).pods}:
        raise Denied(f"{where(pod)}: label {resources.LABEL_REPLICA}={replica!r} names "
                     f"no pod of job {job.name}")
    if pod.metadata.name != resources.pod_name(job, replica):
        raise Denied(f"{where(pod)}: not wired: the operator names {replica} of job "
                     f"{job.name} {resources.pod_name(job, replica)}")
    tor: dict[str, Any] = {}
    if job.spec.network.in_network is not None:
        if not status.get("inNetwork"):
            raise NotYet(f"{where(pod)}: not wired yet: the operator has not recorded "
                         f"TrainingJob {namespace}/{ref.name}'s resolved in-network "
                         "programs in its status (status.inNetwork); the pod's next event "
                         "retries")
        try:
            tor = json.loads(status["inNetwork"])
        except ValueError as err:
            raise Denied(f"{where(pod)}: not wired: status.inNetwork of TrainingJob "
                         f"{namespace}/{ref.name} is not JSON: {err}") from err
    try:
        racks_at = placement.from_status(status.get("placement") or {})
        overlay_id = overlay_ids.from_status(status)
    except ValueError as err:
        raise Denied(f"{where(pod)}: not wired: TrainingJob {namespace}/{ref.name}: "
                     f"{err}") from err
    if overlay_id is None and len({n.name for n in racks_at.values()}) > 1:
        raise NotYet(f"{where(pod)}: not wired yet: the operator has not recorded "
                     f"TrainingJob {namespace}/{ref.name}'s overlay id, the VXLAN id "
                     "that joins its nodes (status.overlayId); the pod's next event "
                     "retries")
    return Admitted(job=job, racks_at=racks_at, job_uid=ref.uid, replica=replica, tor=tor,
                    overlay_id=overlay_id)
