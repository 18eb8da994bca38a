"""What the cluster tests do to the chart's release and to TrainingJobs: helm, and
waiting for a pod, a phase or the garbage collector, with messages that say what was
last seen when the wait runs out."""

import json
import subprocess
import time
from typing import Any

from tailcut.k8s.node import devcluster

RELEASE = "tailcut"
RELEASE_NS = "tailcut-system"


def helm(cluster: Any, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([str(devcluster.helm_binary()), "--kubeconfig",
                          str(cluster.kubeconfig), *args],
                         capture_output=True, text=True, timeout=600)
    if check and out.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)}: exit {out.returncode}\n"
                             f"{out.stdout}\n{out.stderr}")
    return out


def get(cluster: Any, namespace: str, *what: str) -> Any:
    out = cluster.kubectl("-n", namespace, "get", *what, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def wait_pod_running(cluster: Any, namespace: str, name: str,
                     within_s: float = 180.0) -> dict[str, Any]:
    deadline = time.monotonic() + within_s
    pod = None
    while time.monotonic() < deadline:
        pod = get(cluster, namespace, "pod", name)
        if pod and pod["status"].get("phase") == "Running":
            return dict(pod)
        time.sleep(0.5)
    raise AssertionError(f"pod {namespace}/{name} not Running after {within_s:.0f} s: "
                         f"{json.dumps((pod or {}).get('status'), indent=1)[:3000]}")


def wait_phase(cluster: Any, namespace: str, job: str, phase: str,
               within_s: float = 300.0) -> dict[str, Any]:
    """The job's status once its phase is `phase` (and the figures of a finished job
    are in); fails at once on the other terminal phase."""
    deadline = time.monotonic() + within_s
    while True:
        status = job_status(cluster, namespace, job)
        ended = phase_reached(status, phase)
        if ended:
            return status
        if ended is False or time.monotonic() >= deadline:
            raise phase_missed(cluster, namespace, job, phase, status)
        time.sleep(1.0)


def job_status(cluster: Any, namespace: str, job: str) -> dict[str, Any]:
    body = get(cluster, namespace, "trainingjob", job) or {}
    return dict(body.get("status") or {})


def phase_reached(status: dict[str, Any], phase: str) -> bool | None:
    """True once the status is `phase` (a Succeeded job with its figures in), False
    once it ended in the other terminal phase, None while it may still get there."""
    if status.get("phase") == phase and (phase != "Succeeded" or "jctSeconds" in status):
        return True
    if status.get("phase") in ("Succeeded", "Failed") and status.get("phase") != phase:
        return False
    return None


def phase_missed(cluster: Any, namespace: str, job: str, phase: str,
                 status: dict[str, Any]) -> AssertionError:
    """The failure of a wait for `phase`: the last status seen, and the job's pods."""
    pods = cluster.kubectl("-n", namespace, "get", "pods", "-o", "wide", check=False).stdout
    return AssertionError(f"trainingjob {namespace}/{job}: wanted {phase}, status is "
                          f"{json.dumps(status, indent=1)[:3000]}\npods:\n{pods}")


def owned_objects(cluster: Any, namespace: str, job: str) -> list[str]:
    """The pods, services and config maps of `job` still stored."""
    out = cluster.kubectl("-n", namespace, "get", "pods,services,configmaps", "-l",
                          f"tailcut.dev/job={job}", "-o", "name", check=False)
    return out.stdout.split()


RUNTIME_NODE = "tcnode-0"   # the one node whose runtime records the agents are shown


def runtime_state_values(cluster) -> list[str]:
    """The chart's value naming RUNTIME_NODE's containerd state directory
    (tailcut.k8s.node.configs): the install sets it, and so must an upgrade that sets
    values afresh (--reset-values), or the agents would roll; one that gives no value
    keeps the release's."""
    node = next(n for n in cluster.nodes if n.name == RUNTIME_NODE)
    return ["--set", f"agent.hostPaths.runtimeState={node.dir / 'containerd' / 'state'}"]


def agent_log(cluster, node: str) -> str:
    """What the agent serving `node` has logged (its container; the holder beside it
    has its own)."""
    pods = get(cluster, RELEASE_NS, "pods", "-l", "app.kubernetes.io/component=agent",
               "--field-selector", f"spec.nodeName={node}")["items"]
    return cluster.kubectl("-n", RELEASE_NS, "logs", "-c", "agent",
                           pods[0]["metadata"]["name"]).stdout
