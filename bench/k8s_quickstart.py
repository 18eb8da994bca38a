"""The quickstart under `tailcut run` and under `kubectl apply` on a real cluster, side by side.

    tailcut cluster up && tailcut images build && (load + helm install, see docs/kubernetes.md)
    .venv/bin/python bench/k8s_quickstart.py --kubeconfig KUBECONFIG [--runs 3]
        [--transports tcp bounded-loss] [--loss 0.01]

Each run, interleaved: examples/quickstart.yaml through the local runtime (namespaces
on this host), then the same file applied with kubectl to the cluster the kubeconfig
names, where the operator and agent installed by the chart run it as pods. Prints per
run the two JCTs (the PS's own clock in both cases), the time from `kubectl apply` to
every pod Running, and at the end the medians and the ratio JCT(kubernetes) /
JCT(tailcut run). With several --transports (bounded-loss at p = 0.9) each is run in
turn and the ratio JCT(tcp) / JCT(bounded-loss) is printed for both executors; --loss
sets accessLink.loss (the agent applies it on the cluster). Every ratio is marked with
both sides' fidelity verdicts (bench/README.md): a cluster run's is read from the
job's status ("fidelity"), "unmeasured" while the status has none, so no ratio with a
cluster side is "met" until it does. The cluster's own daemons count among the other
processes of the busy-host check: see what it names before passing --allow-busy.
Root (the local runtime builds namespaces)."""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import hostcheck  # noqa: E402
from tailcut import spec  # noqa: E402
from tailcut.k8s.manifests import resources  # noqa: E402
from tailcut.runtime import local  # noqa: E402

TIMEOUT_S = 600.0
DROPS_WAIT_S = 60.0   # after Succeeded: the node agents record each pod's queue drops


def kubectl(kubeconfig: str, *args: str, input: str | None = None) -> str:
    out = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, *args], input=input,
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


TRANSPORTS = {"tcp": {"type": "tcp"}, "bounded-loss": {"type": "bounded-loss", "p": 0.9}}
SETTINGS = {"transport": "tcp", "loss": 0.0}   # set once from the command line


def quickstart(name: str) -> dict[str, Any]:
    raw = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    raw["metadata"]["name"] = name
    raw["spec"]["transport"] = TRANSPORTS[str(SETTINGS["transport"])]
    raw["spec"]["network"]["accessLink"]["loss"] = SETTINGS["loss"]
    return dict(raw)


def run_local(name: str) -> tuple[float, dict[str, Any] | None]:
    """(JCT, the run's fidelity)"""
    with tempfile.TemporaryDirectory(prefix="k8s-bench-local-") as out:
        result = local.run(spec.from_dict(quickstart(name)), Path(out),
                           progress=lambda line: None)
    if not result.converged:
        print(f"  local run {name} did not reach the target accuracy", flush=True)
    return float(result.jct_s), result.fidelity


def run_cluster(kubeconfig: str, namespace: str, name: str) -> tuple[float, float, str]:
    """(JCT from the job's status, seconds from apply to every pod Running, the
    verdict in its status)."""
    jct, running, status = run_job(kubeconfig, namespace, quickstart(name))
    return jct, running, hostcheck.verdict_of(status.get("fidelity"))


def run_job(kubeconfig: str, namespace: str,
            raw: dict[str, Any]) -> tuple[float, float, dict[str, Any]]:
    """Apply the TrainingJob ``raw`` and wait for it to succeed: (JCT from its status,
    seconds from apply to every training pod Running, its final status)."""
    name = raw["metadata"]["name"]
    kubectl(kubeconfig, "-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(raw))
    start = time.monotonic()
    replicas = raw["spec"].get("replicas", {})
    expected = replicas.get("parameterServers", 1) + replicas.get("workers", 1)
    to_running = None
    seen_running: set[str] = set()
    try:
        while time.monotonic() - start < TIMEOUT_S:
            pods = json.loads(kubectl(kubeconfig, "-n", namespace, "get", "pods", "-l",
                                      f"{resources.LABEL_JOB}={name}", "-o", "json"))["items"]
            for pod in pods:
                if pod["status"].get("phase") in ("Running", "Succeeded"):
                    seen_running.add(pod["metadata"]["name"])
            if to_running is None and len(seen_running) >= expected:
                to_running = time.monotonic() - start
            job = json.loads(kubectl(kubeconfig, "-n", namespace, "get", "trainingjob", name,
                                     "-o", "json"))
            status = job.get("status") or {}
            if status.get("phase") == "Failed":
                raise RuntimeError(f"{name} failed: {status.get('conditions')}")
            if status.get("phase") == "Succeeded" and "jctSeconds" in status:
                return (float(status["jctSeconds"]), float(to_running or float("nan")),
                        _with_queue_drops(kubeconfig, namespace, name, status))
            time.sleep(0.5)
        raise RuntimeError(f"{name}: not Succeeded after {TIMEOUT_S:.0f} s")
    finally:
        kubectl(kubeconfig, "-n", namespace, "delete", "trainingjob", name, "--wait=false")


def _with_queue_drops(kubeconfig: str, namespace: str, name: str,
                      status: dict[str, Any]) -> dict[str, Any]:
    """The job's status with its queue drops as the operator gathers them from the
    pods (resources.queue_drops_from_pods), once every pod its node agent wired has
    them: the agent reads a pod's as it releases it, a moment after the job has
    Succeeded, and a pod deleted before that (the job deleted at once) never gets
    them (status.queueDrops then said 0). After DROPS_WAIT_S, what is there."""
    deadline = time.monotonic() + DROPS_WAIT_S
    while True:
        pods = json.loads(kubectl(kubeconfig, "-n", namespace, "get", "pods", "-l",
                                  f"{resources.LABEL_JOB}={name}", "-o", "json"))["items"]
        notes = [p["metadata"].get("annotations") or {} for p in pods]
        wired = [n for n in notes if resources.ANNOTATION_NETWORK in n]
        if wired and all(resources.ANNOTATION_QUEUE_DROPS in n for n in wired):
            return {**status, "queueDrops": resources.queue_drops_from_pods(pods)}
        if time.monotonic() > deadline:
            print(f"{name}: not every pod's queue drops recorded after {DROPS_WAIT_S:.0f} s",
                  file=sys.stderr)
            return status
        time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--namespace", default="tailcut-bench")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--transports", nargs="+", choices=sorted(TRANSPORTS), default=["tcp"])
    ap.add_argument("--loss", type=float, default=0.0, help="accessLink.loss, e.g. 0.01")
    hostcheck.add_arguments(ap)
    args = ap.parse_args()
    watch = hostcheck.before(args)
    SETTINGS["loss"] = args.loss
    subprocess.run(["kubectl", "--kubeconfig", args.kubeconfig, "create", "namespace",
                    args.namespace], capture_output=True)
    if "bounded-loss" in args.transports:   # its pods' privileges are opt-in per namespace
        subprocess.run(["kubectl", "--kubeconfig", args.kubeconfig, "label", "namespace",
                        args.namespace, "tailcut.dev/bounded-loss=allowed", "--overwrite"],
                       check=True, capture_output=True)
    local_jct: dict[str, list[float]] = {t: [] for t in args.transports}
    k8s_jct: dict[str, list[float]] = {t: [] for t in args.transports}
    to_running: list[float] = []
    verdicts: dict[str, dict[str, list[str]]] = {
        t: {"kubernetes": [], "tailcut run": []} for t in args.transports}
    for run in range(args.runs):
        for transport in args.transports:
            SETTINGS["transport"] = transport
            name = f"k8s-bench-{'bl' if transport == 'bounded-loss' else transport}-{run}"
            local_jct_s, fidelity = run_local(name)
            local_jct[transport].append(local_jct_s)
            jct, running, cluster_verdict = run_cluster(args.kubeconfig, args.namespace, name)
            k8s_jct[transport].append(jct)
            verdicts[transport]["tailcut run"].append(hostcheck.verdict_of(fidelity))
            verdicts[transport]["kubernetes"].append(cluster_verdict)
            to_running.append(running)
            print(f"run {run + 1}/{args.runs} {transport}: tailcut run JCT "
                  f"{local_jct[transport][-1]:.2f} s, kubectl apply JCT {jct:.2f} s, "
                  f"apply -> all pods Running {running:.1f} s; tailcut run "
                  f"{hostcheck.during(fidelity)}, kubernetes {cluster_verdict}", flush=True)
    print(f"\nquickstart, loss {args.loss}, median of {args.runs} runs "
          f"(apply -> all Running {statistics.median(to_running):.1f} s):")
    med_local = {t: statistics.median(v) for t, v in local_jct.items()}

    def mark_transports(executor: str) -> str:
        return hostcheck.mark({t: verdicts[t][executor] for t in ("tcp", "bounded-loss")})

    med_k8s = {t: statistics.median(v) for t, v in k8s_jct.items()}
    for t in args.transports:
        print(f"  {t:>12}: tailcut run {med_local[t]:.2f} s, kubernetes {med_k8s[t]:.2f} s, "
              f"JCT(kubernetes) / JCT(tailcut run) = {med_k8s[t] / med_local[t]:.2f} "
              f"{hostcheck.mark(verdicts[t])}")
    if {"tcp", "bounded-loss"} <= set(args.transports):
        here = med_local["tcp"] / med_local["bounded-loss"]
        there = med_k8s["tcp"] / med_k8s["bounded-loss"]
        print(f"JCT(tcp) / JCT(bounded-loss p=0.9): tailcut run {here:.2f} "
              f"{mark_transports('tailcut run')}, kubernetes {there:.2f} "
              f"{mark_transports('kubernetes')} (kubernetes / tailcut run {there / here:.2f})")
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
