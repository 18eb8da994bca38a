"""What a TrainingJob becomes on Kubernetes: pods, a headless service, a config map.

Pure functions from a validated TrainingJob to manifests (plain dicts), and from the
job's pods back to a status; the operator only sends them. For a job `demo` with one
PS and two workers in namespace `lab`:

    ConfigMap demo-spec      spec.yaml (the job, defaults filled in) and flows.json
                             (per-tensor tags, tailcut.k8s.manifests.policy), for the roles
    Service   demo           headless (clusterIP None); gives ps-0.demo.lab.svc (for
                             people: roles talk over the job's links, below)
    Pod       demo-ps-0      hostname ps-0, subdomain demo; role ps, rack rack-0
    Pod       demo-worker-0  connects to ps-0 at 10.1.0.2:7000, its address on the job's
    Pod       demo-worker-1  links: the node agent wires each pod into its rack (tc0)

Every object carries the labels below and an ownerReference to the TrainingJob
(controller: true), so deleting the job deletes them all. The labels only find
things: what counts as the job's is what the job controls (owned_pods). A backgroundLoad adds its
own config map, pods and sidecars (tailcut.k8s.manifests.background).
"""

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping, Optional

import yaml

from tailcut import plan
from tailcut.fidelity import verdict
from tailcut.k8s.manifests import crd, placement, policy
from tailcut.spec.model import TrainingJob
from tailcut.training import exits

LABEL_JOB = "tailcut.dev/job"
LABEL_ROLE = "tailcut.dev/role"         # ps | worker | aggregator | replica | bg-*
LABEL_REPLICA = "tailcut.dev/replica"   # ps-0, worker-3: the pod's name inside the job
LABEL_RACK = "tailcut.dev/rack"
ANNOTATION_NETWORK = "tailcut.dev/network"   # the agent's: what the pod's links got
ANNOTATION_QUEUE_DROPS = "tailcut.dev/queue-drops"   # the agent's, as it releases the pod
ANNOTATION_WIRING_ERROR = "tailcut.dev/wiring-error"   # the agent's: why it could not wire
# The agent's, beside the wiring error when no retry can mend it (the node's network
# MTU is short of the job's + VXLAN, no kernel headers): the job fails at once.
ANNOTATION_NODE_UNFIT = "tailcut.dev/node-unfit"
# The agent's, beside the wiring error, when it refuses a pod of the job for good
# (tailcut.k8s.agent.admission.Denied): the job fails at once too, reason AgentRefused.
ANNOTATION_REFUSED = "tailcut.dev/refused"
# A namespace opts in to bounded-loss pods (root with BPF, NET_ADMIN, PERFMON) with this
# label; the operator fails a bounded-loss job anywhere else, naming it.
LABEL_NAMESPACE_XDP = "tailcut.dev/bounded-loss"
XDP_ALLOWED_VALUE = "allowed"
# What each container of a job's pods requests unless the chart says otherwise
# (workers.resources): a ResourceQuota on requests refuses pods that state none.
DEFAULT_RESOURCES: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "128Mi"}}
# Every pod of a job: the runtime's default seccomp filter (Pod Security's restricted
# level asks for it; containerd's lets BPF and PERFMON holders make their calls).
POD_SECURITY = {"seccompProfile": {"type": "RuntimeDefault"}}
SPEC_KEY = "spec.yaml"
SPEC_MOUNT = "/etc/tailcut"
PS_PORT = plan.PS_PORT
# How long a pod that failed only because a peer went away waits for that peer's own
# failure before the job fails naming it alone; while it waits, the job's Running
# condition has this reason (the operator's timer looks again once it is past).
PEER_GONE_GRACE_S = 10.0
REASON_AWAITING_CAUSE = "AwaitingCause"
ROLE_NAMES = {"ps": "PS", "worker": "Worker"}   # replicaStatuses keys, as Kubeflow's


def role_of(replica: str) -> str:
    """'worker-3' -> 'worker', 'bg-client-0' -> 'bg-client': the name minus its index."""
    return replica.rsplit("-", 1)[0]


def role_key(role: str) -> str:
    """The replicaStatuses key of a role: PS, Worker, or the role's own name."""
    return ROLE_NAMES.get(role, role)


def owner_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{crd.GROUP}/{crd.VERSION}", "kind": "TrainingJob",
            "name": body["metadata"]["name"], "uid": body["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


def labels(job: TrainingJob, role: Optional[str] = None, replica: Optional[str] = None,
           rack: Optional[str] = None) -> dict[str, str]:
    out = {"app.kubernetes.io/name": "tailcut", "app.kubernetes.io/part-of": "tailcut",
           "app.kubernetes.io/managed-by": "tailcut-operator", LABEL_JOB: job.name}
    for key, value in ((LABEL_ROLE, role), (LABEL_REPLICA, replica), (LABEL_RACK, rack)):
        if value is not None:
            out[key] = value
    return out


def spec_map_name(job: TrainingJob) -> str:
    return f"{job.name}-spec"


def pod_name(job: TrainingJob, replica: str) -> str:
    return f"{job.name}-{replica}"


def config_map(job: TrainingJob, owner: dict[str, Any]) -> dict[str, Any]:
    """What the job's pods read (mounted at SPEC_MOUNT). The node agents do not read
    it: they build from the TrainingJob itself (tailcut.k8s.agent.admission)."""
    spec_yaml = yaml.safe_dump(job.model_dump(by_alias=True, mode="json"), sort_keys=False)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": spec_map_name(job), "labels": labels(job),
                         "ownerReferences": [owner]},
            "data": {SPEC_KEY: spec_yaml, **policy.config_data(job)}}


def controller_uid(obj: Mapping[str, Any]) -> Optional[str]:
    """The UID of the object's controller (its ownerReference with controller: true),
    as the API server returns objects; None without one."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def owned_pods(job_name: str, job_uid: str,
               pod_list: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The job's own pods among those labelled with its name: controlled by the
    TrainingJob with that UID and named as the operator names them. A label is anyone's
    to set, so nothing else may count towards the job's status."""
    out = []
    for pod in pod_list:
        meta = pod.get("metadata") or {}
        replica = (meta.get("labels") or {}).get(LABEL_REPLICA)
        if (controller_uid(pod) == job_uid and replica is not None
                and meta.get("name") == f"{job_name}-{replica}"):
            out.append(pod)
    return out


def service(job: TrainingJob, owner: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": job.name, "labels": labels(job),
                         "ownerReferences": [owner]},
            "spec": {"clusterIP": "None", "selector": {LABEL_JOB: job.name},
                     # Workers must find the PS before it reports ready.
                     "publishNotReadyAddresses": True,
                     "ports": [{"name": "ps", "port": PS_PORT, "protocol": "TCP"}]}}


# What a pod whose role attaches the XDP counter (bounded-loss) is granted, and why;
# the chart's values.yaml (workers.xdp) repeats it. The least that works: the role
# runs as root in its container, which is what makes added capabilities effective
# (Kubernetes has no ambient capabilities), with every capability dropped but these.
XDP_CAPABILITIES = ("BPF",        # load the counter and create its maps
                    "NET_ADMIN",  # attach XDP to the pod's own eth0
                    "PERFMON")    # without it the verifier refuses the counter's
                                  # variable-offset packet access (IP options): that
                                  # needs the Spectre v1 bypass, granted to PERFMON
XDP_HOST_PATHS = {"modules": "/lib/modules",   # BCC compiles the counter against the
                  "headers": "/usr/src"}       # running kernel's headers (read-only)


def _security(job: TrainingJob) -> dict[str, Any]:
    if plan.needs_xdp(job):
        return {"allowPrivilegeEscalation": False, "runAsUser": 0, "runAsNonRoot": False,
                "capabilities": {"drop": ["ALL"], "add": list(XDP_CAPABILITIES)}}
    return {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": 65532,
            "capabilities": {"drop": ["ALL"]}}


def _xdp_mounts(job: TrainingJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumeMounts, volumes) of the kernel headers a bounded-loss role compiles with."""
    if not plan.needs_xdp(job):
        return [], []
    return ([{"name": name, "mountPath": path, "readOnly": True}
             for name, path in XDP_HOST_PATHS.items()],
            [{"name": name, "hostPath": {"path": path, "type": "Directory"}}
             for name, path in XDP_HOST_PATHS.items()])


def pods(job: TrainingJob, owner: dict[str, Any], image: str,
         pull_policy: str = "IfNotPresent",
         where: Optional[placement.Placement] = None,
         container_resources: Optional[dict[str, Any]] = None) -> list[dict[str, Any]]:
    racks = job.spec.rack_of()
    mounts, volumes = _xdp_mounts(job)
    out = []
    for replica in job.spec.pod_names():
        role = role_of(replica)
        out.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": pod_name(job, replica),
                "labels": labels(job, role, replica, racks[replica]),
                # The node agent wires a pod because this TrainingJob controls it
                # (tailcut.k8s.agent.admission), and builds from the job, not from the pod.
                "ownerReferences": [owner]},
            "spec": {
                "hostname": replica, "subdomain": job.name,
                **rack_scheduling(job, racks[replica], where),
                "restartPolicy": "Never",
                # Roles talk to each other, never to the API server.
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "securityContext": POD_SECURITY,
                "containers": [{
                    "name": role, "image": image, "imagePullPolicy": pull_policy,
                    # ps-0 writes its final figures there (figures_from_pods); a role
                    # that fails without writing leaves the end of its log instead.
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "args": ["--spec", f"{SPEC_MOUNT}/{SPEC_KEY}", "--replica", replica],
                    "env": [{"name": "OMP_NUM_THREADS", "value": "1"},
                            {"name": "POD_NAMESPACE", "valueFrom": {
                                "fieldRef": {"fieldPath": "metadata.namespace"}}}],
                    "volumeMounts": [{"name": "spec", "mountPath": SPEC_MOUNT,
                                      "readOnly": True}, *mounts],
                    "securityContext": _security(job),
                    "resources": container_resources or DEFAULT_RESOURCES,
                }],
                "volumes": [{"name": "spec",
                             "configMap": {"name": spec_map_name(job)}}, *volumes],
            }})
    return out


def status_from_pods(job: TrainingJob, pod_list: list[dict[str, Any]],
                     now: Optional[datetime] = None
                     ) -> tuple[str, dict[str, dict[str, int]], str, str]:
    """(phase, replicaStatuses, reason, message) from the job's pods as the API server
    returns them, at `now` (UTC; default: the clock). Any failed pod fails the job and
    is named in the message, though one that failed only because a peer went away
    waits up to PEER_GONE_GRACE_S for that peer to be named first; the job
    succeeds when every worker has succeeded; it runs once every pod runs. With a PS
    replica, ps-0 may be lost (failed or deleted): replica-0 takes over, as under
    `tailcut run`, and the job goes on without it."""
    now = now or datetime.now(timezone.utc)
    tally = _PodTally(counts={role_key(role_of(r)): {"active": 0, "succeeded": 0, "failed": 0}
                              for r in job.spec.pod_names()})
    expected = set(job.spec.pod_names())
    may_be_lost = {"ps-0"} if job.spec.replicas.ps_replica else set()
    for pod in pod_list:
        _tally_pod(tally, pod, expected, may_be_lost)
    phase, reason, message = (_status_of_failures(tally, now)
                              or _status_of_progress(tally.seen, expected, may_be_lost))
    return phase, tally.counts, reason, message


@dataclass
class _PodTally:
    """What status_from_pods reads off the job's pods, before it decides."""
    counts: dict[str, dict[str, int]]   # the replicaStatuses
    seen: dict[str, str] = field(default_factory=dict)   # replica: its pod's phase
    failed: list[str] = field(default_factory=list)   # "pod: why", of the causes
    # (said, when it ended) of the pods that failed only because a peer went away
    victims: list[tuple[str, datetime]] = field(default_factory=list)
    unfit: list[str] = field(default_factory=list)   # on a node its agent found unfit
    refused: list[str] = field(default_factory=list)   # refused for good by their node's agent


def _tally_pod(tally: _PodTally, pod: dict[str, Any], expected: set[str],
               may_be_lost: set[str]) -> None:
    """Count one pod in `tally`; a pod of no replica the job expects is skipped."""
    meta = pod.get("metadata", {})
    replica = meta.get("labels", {}).get(LABEL_REPLICA)
    if replica not in expected:
        return
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    tally.seen[replica] = phase
    count = tally.counts[role_key(role_of(replica))]
    if phase == "Succeeded":
        count["succeeded"] += 1
    elif phase == "Failed":
        count["failed"] += 1
        if replica not in may_be_lost:
            _tally_failure(tally, pod, meta)
    else:
        count["active"] += 1
    _tally_unwirable(tally, count, phase, meta)


def _tally_failure(tally: _PodTally, pod: dict[str, Any], meta: dict[str, Any]) -> None:
    """Record why a failed pod failed: as a cause, or as a victim of a peer's going."""
    said = f"{meta.get('name')}: {_why_failed(pod)}"
    ended = _peer_gone_at(pod)
    if ended is None:
        tally.failed.append(said)
    else:
        tally.victims.append((said, ended))


def _tally_unwirable(tally: _PodTally, count: dict[str, int], phase: str,
                     meta: dict[str, Any]) -> None:
    """Count a pod its agent will never wire (node unfit, or refused) as failed: now,
    not at its timeout."""
    annotations = meta.get("annotations") or {}
    ending = phase not in ("Succeeded", "Failed")
    unfit = annotations.get(ANNOTATION_NODE_UNFIT) if ending else None
    refused = annotations.get(ANNOTATION_REFUSED) if ending else None
    if unfit or refused:
        count["active"] -= 1
        count["failed"] += 1
        (tally.unfit if unfit else tally.refused).append(
            f"{meta.get('name')}: {unfit or refused}")


def _status_of_failures(tally: _PodTally, now: datetime) -> Optional[tuple[str, str, str]]:
    """(phase, reason, message) when pods failed or cannot be wired, None when none did."""
    if tally.refused:
        return "Failed", "AgentRefused", "; ".join(sorted(tally.refused))
    if tally.unfit:
        return "Failed", "NodeUnfit", "; ".join(sorted(tally.unfit))
    victims, failed = tally.victims, tally.failed
    if victims and not failed and any(p not in ("Succeeded", "Failed")
                                      for p in tally.seen.values()):
        # Each failed pod only saw a peer go away (tailcut.training.exits.PEER_GONE):
        # the pod that failed first is usually a moment behind. Wait for it, so the
        # job's message names the cause, not only its victims.
        newest = max(ended for _, ended in victims)
        if now - newest < timedelta(seconds=PEER_GONE_GRACE_S):
            return ("Running", REASON_AWAITING_CAUSE,
                    f"{'; '.join(sorted(s for s, _ in victims))}; waiting up to "
                    f"{PEER_GONE_GRACE_S:.0f} s for the pod whose failure it saw")
    if failed or victims:   # the cause first, then what it took down with it
        return "Failed", "PodFailed", "; ".join(
            sorted(failed) + sorted(s for s, _ in victims))
    return None


def _status_of_progress(seen: dict[str, str], expected: set[str],
                        may_be_lost: set[str]) -> tuple[str, str, str]:
    """(phase, reason, message) when no pod failed (but maybe ps-0, with a replica):
    lost both PS copies, done, running or still pending."""
    lost = sorted(r for r in may_be_lost if seen.get(r, "Failed") == "Failed")
    if lost and seen.get("replica-0") == "Failed":
        return "Failed", "PodFailed", "ps-0 and its replica replica-0 both failed"
    workers = [r for r in expected if r.startswith("worker-")]
    if workers and all(seen.get(w) == "Succeeded" for w in workers):
        return "Succeeded", "AllWorkersSucceeded", f"{len(workers)} workers succeeded"
    needed = expected - set(lost)
    running = [r for r in needed if seen.get(r) in ("Running", "Succeeded")]
    if len(running) == len(needed):
        note = f" ({', '.join(lost)} lost; replica-0 serves)" if lost else ""
        return "Running", "AllPodsRunning", f"{len(running)} pods running{note}"
    waiting = len(needed) - len(running)
    return "Pending", "PodsPending", f"{waiting} of {len(expected)} pods not running yet"


def network_from_pods(pod_list: list[dict[str, Any]]) -> dict[str, str]:
    """What the node agents applied on every link end of the job ("rack-0/up",
    "worker-1/tc0": description), gathered from the pods' annotations."""
    applied: dict[str, str] = {}
    for pod in pod_list:
        raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_NETWORK)
        try:
            links = json.loads(raw) if raw else {}
        except ValueError:
            continue   # not the agent's writing: ignore rather than fail the status
        if isinstance(links, dict):
            applied.update({str(k): str(v) for k, v in links.items()})
    return dict(sorted(applied.items()))


def wiring_errors_from_pods(pod_list: list[dict[str, Any]]) -> dict[str, str]:
    """status.wiringErrors: per replica, why a node agent could not wire its pod (what
    it recorded on the pod; cleared once wiring passes)."""
    out = {}
    for pod in pod_list:
        meta = pod.get("metadata") or {}
        said = (meta.get("annotations") or {}).get(ANNOTATION_WIRING_ERROR)
        replica = (meta.get("labels") or {}).get(LABEL_REPLICA)
        if said and replica:
            out[str(replica)] = str(said)
    return dict(sorted(out.items()))


def queue_drops_from_pods(pod_list: list[dict[str, Any]]) -> dict[str, Any]:
    """status.queueDrops: the packets each link end's full queues dropped ("rack-0/up",
    "worker-1/tc0": count) and their total, from what the node agents wrote on the pods
    as they released them; {} before any has. An uplink's count grows while its pods
    go and each of them reports it: the largest wins."""
    ends: dict[str, int] = {}
    for pod in pod_list:
        raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(
            ANNOTATION_QUEUE_DROPS)
        try:
            drops = json.loads(raw) if raw else {}
        except ValueError:
            continue   # not the agent's writing: ignore rather than fail the status
        if not isinstance(drops, dict):
            continue
        for end, count in drops.items():
            if type(count) is int:
                ends[str(end)] = max(ends.get(str(end), 0), count)
    if not ends:
        return {}
    return {"total": sum(ends.values()), "byLinkEnd": dict(sorted(ends.items()))}


def rack_scheduling(job: TrainingJob, rack: str,
                    where: Optional[placement.Placement] = None) -> dict[str, Any]:
    """Where a pod of `rack` runs (training or background: tailcut.k8s.manifests.background):
    on its rack's node of the placement, which a rack's veths need; without one
    (no node known yet), pods of one rack prefer one node and racks prefer
    different nodes (preferred, so a one-node cluster still runs the job)."""
    pinned = placement.scheduling(rack, where or {})
    return pinned if pinned is not None else {"affinity": _rack_affinity(job, rack)}


def _rack_affinity(job: TrainingJob, rack: str) -> dict[str, Any]:
    same_job = {"key": LABEL_JOB, "operator": "In", "values": [job.name]}
    host = "kubernetes.io/hostname"
    return {
        "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "podAffinityTerm": {"topologyKey": host, "labelSelector": {
                "matchExpressions": [same_job, {"key": LABEL_RACK, "operator": "In",
                                                "values": [rack]}]}}}]},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 50, "podAffinityTerm": {"topologyKey": host, "labelSelector": {
                "matchExpressions": [same_job, {"key": LABEL_RACK, "operator": "NotIn",
                                                "values": [rack]}]}}}]},
    }


def _peer_gone_at(pod: dict[str, Any]) -> Optional[datetime]:
    """When a failed pod's container ended, if it ended only because a peer went away
    (exit code tailcut.training.exits.PEER_GONE); None for any other failure. A time
    the API server did not give is taken as long ago (the pod waits for no one)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or {}
        if term.get("exitCode") == exits.PEER_GONE:
            try:
                return datetime.fromisoformat(str(term["finishedAt"]).replace("Z", "+00:00"))
            except (KeyError, ValueError):
                return datetime.min.replace(tzinfo=timezone.utc)
    return None


def _why_failed(pod: dict[str, Any]) -> str:
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            detail = term.get("message") or term.get("reason") or ""
            return f"container {cs.get('name')} exited with code {term.get('exitCode')}" + (
                f" ({detail.strip()})" if detail else "")
    return status.get("message") or status.get("reason") or "failed"


def figures_from_done(job: TrainingJob, done: dict[str, Any]) -> dict[str, Any]:
    """The status fields of a finished job from the PS's "done" event (the termination
    message of ps-0, written by workers/entrypoint.py), as the local backend fills them.
    The fidelity verdict comes from the host's CPU the leader saw over the training
    window (its node's; the links and other processes are not sampled on a cluster)."""
    host = done.get("host")
    return {"jctSeconds": round(float(done["jct_s"]), 2),
            "accuracy": round(float(done["final_accuracy"]), 4),
            "loss": round(float(done["final_loss"]), 4),
            "converged": bool(done["converged"]), "epoch": int(done["epochs"]),
            "progress": f"{int(done['epochs'])}/{job.spec.training.epochs} epochs",
            **fidelity_status(verdict.judge(host=host) if isinstance(host, dict) else None)}


def fidelity_status(fidelity: Optional[dict[str, Any]]) -> dict[str, Any]:
    """status.fidelity from a run's verdict (tailcut.fidelity.verdict); {} without one."""
    if not fidelity:
        return {}
    return {"fidelity": {"verdict": fidelity["verdict"],
                         "reasons": list(fidelity.get("reasons") or []),
                         "notes": list(fidelity.get("notes") or [])}}


def figures_from_pods(job: TrainingJob, pod_list: list[dict[str, Any]]) -> dict[str, Any]:
    """figures_from_done of the termination message of ps-0 once it has ended, or of
    replica-0 if ps-0 left none (it was lost and the replica finished the job); else
    {}. A message that is not the PS's JSON (e.g. a crash's last words) counts as none."""
    by_replica = {(p.get("metadata") or {}).get("labels", {}).get(LABEL_REPLICA): p
                  for p in pod_list}
    for replica in (plan.leader(job), "replica-0"):   # worker-0 under allreduce
        statuses = (by_replica.get(replica) or {}).get("status") or {}
        for cs in statuses.get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated") or {}
            try:
                return figures_from_done(job, json.loads(term.get("message") or ""))
            except (ValueError, KeyError, TypeError):
                pass
    return {}


def progress_from_log(job: TrainingJob, log: str) -> dict[str, Any]:
    """The progress fields from the last epoch event in a PS's log (its JSON lines,
    tailcut.training.role), or {} when no epoch has ended yet."""
    for line in reversed(log.splitlines()):
        if not line.startswith("{") or '"epoch"' not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "epoch":
            epoch = int(event["epoch"])
            return {"epoch": epoch, "progress": f"{epoch}/{job.spec.training.epochs} epochs"}
    return {}
