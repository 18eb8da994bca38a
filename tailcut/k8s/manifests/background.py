"""What a TrainingJob's backgroundLoad becomes on Kubernetes: a config map, background
server and Locust pods, and sidecars in training pods named as senders or receivers.

Pure functions from a validated job to manifests, as tailcut.k8s.manifests.resources does for
the training pods. For `senders: [rack-1]`, `receivers: [ps-0, rack-0]` in job `demo`:

    ConfigMap demo-background   locust-config.json: servers (by address), rate, users,
                                shape, flow-size CDF, run time
    Pod demo-bg-server-0        hostname bg-server-0, rack rack-1: the flow server
    Pod demo-ps-0               + sidecars locust-master and locust (worker)
    Pod demo-bg-client-1        rack rack-0: a Locust worker

Background pods carry the job's labels, its rack label and rack affinity, so they
land with their rack's training pods; they are controlled by the TrainingJob, so the
node agent shapes their access link as it shapes a training pod's; they have
activeDeadlineSeconds, so they end with the job or by themselves.
Sidecars in a training pod are native sidecars (init containers with restartPolicy
Always): they start before the role and are stopped when it exits.
"""

import json
import math
from typing import Any, Optional

from tailcut.background import launch
from tailcut.background import plan as bgplan
from tailcut.k8s.manifests import placement, resources
from tailcut.net import naming, topology
from tailcut.spec.model import TrainingJob

CONFIG_KEY = "locust-config.json"
CONFIG_MOUNT = "/etc/tailcut-background"
RESULTS_MOUNT = "/results"
RESULTS_SUBDIR = "background"
DEADLINE_MARGIN_S = 60   # image pull and start-up on top of the run itself
ANNOTATION = "tailcut.dev/background"   # on every pod with background containers
SERVER_CONTAINER = "bg-server"
ROLES = topology.BACKGROUND_ROLES   # bg-server, bg-client


def plan(job: TrainingJob) -> Optional[bgplan.Plan]:
    """The job's background plan, as `tailcut run` makes it: every endpoint at its
    address on the job's links (the node agent gives each pod that address on tc0).
    Raises SpecError for a rate Locust cannot drive, as `tailcut run` does: call it
    before creating anything."""
    return bgplan.plan(job, topology.plan(job))


def check(job: TrainingJob) -> None:
    """Raise SpecError if the job's backgroundLoad cannot run (see plan)."""
    plan(job)


def config_map_name(job: TrainingJob) -> str:
    return f"{job.name}-background"


def pod_config(p: bgplan.Plan) -> dict[str, Any]:
    """What the background containers read: the local runtime's Locust config (servers
    as http://<pod>.<job>:8080) plus the run time, server lifetime and Locust layout."""
    config = p.locust_config()
    config.update({
        "job": p.job, "run_time_s": p.run_time_s,
        "server_duration_s": launch.server_duration_s(p.run_time_s),
        "clients": len(p.clients), "master_host": p.clients[0].ip,
        "target": {"link": p.link.name if p.link else None,
                   "direction": p.link.direction if p.link else None,
                   "loadFactor": p.target_load_factor,
                   "linkBandwidthBit": p.link.bandwidth_bit if p.link else None},
        "mean_flow_bytes": p.mean_flow_bytes,
        "distribution": p.load.flow_sizes.distribution,
    })
    return config


def config_map(job: TrainingJob, p: bgplan.Plan, owner: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": config_map_name(job), "labels": resources.labels(job),
                         "ownerReferences": [owner]},
            "data": {CONFIG_KEY: json.dumps(pod_config(p), indent=2) + "\n"}}


def active_deadline_s(p: bgplan.Plan) -> int:
    """A background pod's activeDeadlineSeconds: the servers' lifetime (Locust's run
    plus its stop grace) and a margin for starting."""
    return math.ceil(launch.server_duration_s(p.run_time_s) + DEADLINE_MARGIN_S)


def containers(p: bgplan.Plan, pod: str, image: str, sidecar: bool = False,
               pull_policy: str = "IfNotPresent",
               container_resources: Optional[dict[str, Any]] = None
               ) -> list[dict[str, Any]]:
    """The background containers of `pod` (a background pod or a training pod):
    a server if it sends; Locust if it receives (standalone for one receiver, else a
    worker, and in the first receiver also the master)."""
    out = []
    if pod in [s.pod for s in p.servers]:
        out.append(_container(SERVER_CONTAINER, ["server"], image, pull_policy, sidecar,
                              container_resources, port=("bg-http", bgplan.SERVER_PORT)))
    clients = [c.pod for c in p.clients]
    if pod in clients:
        if len(clients) == 1:
            out.append(_container("locust", ["locust", "--mode", "standalone"], image,
                                  pull_policy, sidecar, container_resources))
        else:
            if pod == clients[0]:
                out.append(_container("locust-master", ["locust", "--mode", "master"], image,
                                      pull_policy, sidecar, container_resources,
                                      port=("locust-master", bgplan.LOCUST_MASTER_PORT)))
            out.append(_container("locust", ["locust", "--mode", "worker"], image,
                                  pull_policy, sidecar, container_resources))
    return out


def pods(job: TrainingJob, p: bgplan.Plan, owner: dict[str, Any], image: str,
         pull_policy: str = "IfNotPresent",
         where: Optional[placement.Placement] = None,
         container_resources: Optional[dict[str, Any]] = None) -> list[dict[str, Any]]:
    """The background pods of racks named as senders or receivers."""
    topo = topology.plan(job)
    out = []
    for rack in topo.racks:
        for bg in (q for q in rack.pods if q.role in ROLES):
            out.append({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "name": resources.pod_name(job, bg.name),
                    "labels": resources.labels(job, bg.role, bg.name, rack.name),
                    "annotations": {ANNOTATION: ",".join(c["name"] for c in containers(
                        p, bg.name, image))},
                    # The agent wires every pod the job controls: a background pod
                    # gets the access link its rack's training pods have.
                    "ownerReferences": [owner]},
                "spec": {
                    "hostname": bg.name, "subdomain": job.name,
                    **resources.rack_scheduling(job, rack.name, where),
                    "restartPolicy": "Never",
                    "activeDeadlineSeconds": active_deadline_s(p),
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": resources.POD_SECURITY,
                    "containers": containers(p, bg.name, image, pull_policy=pull_policy,
                                             container_resources=container_resources),
                    "volumes": _volumes(job),
                }})
    return out


def with_sidecars(job: TrainingJob, p: Optional[bgplan.Plan],
                  training_pods: list[dict[str, Any]], image: str,
                  pull_policy: str = "IfNotPresent",
                  container_resources: Optional[dict[str, Any]] = None
                  ) -> list[dict[str, Any]]:
    """The training pods, with background sidecars in those named as senders or
    receivers (so the flows share that pod's access link)."""
    if p is None:
        return training_pods
    for pod in training_pods:
        replica = pod["metadata"]["labels"][resources.LABEL_REPLICA]
        extra = containers(p, replica, image, sidecar=True, pull_policy=pull_policy,
                           container_resources=container_resources)
        if extra:
            pod["metadata"].setdefault("annotations", {})[ANNOTATION] = ",".join(
                c["name"] for c in extra)
            pod["spec"].setdefault("initContainers", []).extend(extra)
            pod["spec"]["volumes"] = pod["spec"].get("volumes", []) + _volumes(job)
    return training_pods


def status(job: TrainingJob, p: bgplan.Plan, namespace: str) -> dict[str, Any]:
    """status.background: what runs where, and where Locust's statistics end up."""
    first = p.clients[0].pod
    container = "locust" if len(p.clients) == 1 else "locust-master"
    where = f"{resources.pod_name(job, first)}"
    return {
        "configMap": config_map_name(job),
        "servers": [resources.pod_name(job, s.pod) for s in p.servers],
        "clients": [resources.pod_name(job, c.pod) for c in p.clients],
        "requestsPerS": round(p.requests_per_s, 3),
        "users": p.users,
        "runTimeS": p.run_time_s,
        "targetLoadFactor": p.target_load_factor,
        "targetLink": p.link.name if p.link else None,
        "locustStats": (f"kubectl -n {namespace} logs {where} -c {container} (CSV files "
                        f"between '----- begin <file> -----' lines; also in "
                        f"{RESULTS_MOUNT}/{RESULTS_SUBDIR} of that container while it runs)"),
    }


def pods_summary(pod_list: list[dict[str, Any]]) -> dict[str, Any]:
    """Status fields from a job's pods as the API server returns them: background pods
    by phase, and what the servers' interfaces sent (each server container's
    termination message, tailcut.background.pod). `sentLoadFactor` is the servers'
    summed share of the target link, once every server has reported."""
    counts = {"active": 0, "succeeded": 0, "failed": 0}
    servers = reports = 0
    load = 0.0
    mbit = 0.0
    for pod in pod_list:
        meta = pod.get("metadata") or {}
        if ANNOTATION not in (meta.get("annotations") or {}):
            continue
        status = pod.get("status") or {}
        if (meta.get("labels") or {}).get(resources.LABEL_ROLE) in ROLES:
            phase = status.get("phase") or "Pending"
            key = {"Succeeded": "succeeded", "Failed": "failed"}.get(phase, "active")
            counts[key] += 1
        spec = pod.get("spec") or {}
        if any(c.get("name") == SERVER_CONTAINER
               for c in spec.get("containers", []) + spec.get("initContainers", [])):
            servers += 1
        for cs in status.get("containerStatuses", []) + status.get("initContainerStatuses", []):
            if cs.get("name") != SERVER_CONTAINER:
                continue
            sent = _sent_report(((cs.get("state") or {}).get("terminated") or {}).get("message"))
            if sent is not None:
                reports += 1
                load += sent.get("load_factor_of_target_link") or 0.0
                mbit += sent.get("mbit_per_s") or 0.0
    out: dict[str, Any] = {"pods": counts, "serversReported": reports}
    if servers and reports == servers:
        out["sentMbitPerS"] = round(mbit, 3)
        out["sentLoadFactor"] = round(load, 4)
    return out


def _sent_report(message: Optional[str]) -> Optional[dict[str, Any]]:
    try:
        sent = json.loads(message or "")["sent"]
    except (ValueError, KeyError, TypeError):
        return None
    return sent if isinstance(sent, dict) else None


def _container(name: str, args: list[str], image: str, pull_policy: str, sidecar: bool,
               container_resources: Optional[dict[str, Any]] = None,
               port: Optional[tuple[str, int]] = None) -> dict[str, Any]:
    argv = args + ["--config", f"{CONFIG_MOUNT}/{CONFIG_KEY}",
                   "--results", f"{RESULTS_MOUNT}/{RESULTS_SUBDIR}",
                   "--ifname", naming.DATA_IF]   # the pod's interface on the job's links
    if sidecar:
        argv.append("--stay")   # exiting would make the kubelet restart a sidecar
    c: dict[str, Any] = {
        "name": name, "image": image, "imagePullPolicy": pull_policy,
        # Not the worker image's entrypoint (it runs ps and worker roles only).
        "command": ["python", "-m", "tailcut.background.pod"], "args": argv,
        "env": [{"name": "HOME", "value": "/tmp"},   # Locust and gevent write caches
                {"name": "OMP_NUM_THREADS", "value": "1"}],
        "volumeMounts": [{"name": "background", "mountPath": CONFIG_MOUNT, "readOnly": True},
                         {"name": "background-results", "mountPath": RESULTS_MOUNT}],
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                            "runAsUser": 65532, "capabilities": {"drop": ["ALL"]}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": container_resources or resources.DEFAULT_RESOURCES,
    }
    if port is not None:
        c["ports"] = [{"name": port[0], "containerPort": port[1], "protocol": "TCP"}]
    if name == SERVER_CONTAINER:
        c["readinessProbe"] = {"tcpSocket": {"port": bgplan.SERVER_PORT},
                               "periodSeconds": 2}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def _volumes(job: TrainingJob) -> list[dict[str, Any]]:
    return [{"name": "background", "configMap": {"name": config_map_name(job)}},
            {"name": "background-results", "emptyDir": {}}]
