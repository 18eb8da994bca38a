"""p99 completion of a 4 MB PUSH under `tailcut run`'s network and on the cluster, side by side.

    tailcut cluster up && tailcut images build && (load + helm install, see docs/kubernetes.md)
    .venv/bin/python bench/k8s_push.py --kubeconfig KUBECONFIG [--runs 3] [--rounds 15]
        [--transports tcp bounded-loss] [--racks 1|2]

The bench roles of bench/bl_completion.py (bench/bl_role.py: 4 workers each PUSH a
4 MiB float32 vector to ps-0, --rounds times; ps-0 records each message's completion,
first byte sent -> message handed over; the first round warms up and is left out)
run twice per transport and run, interleaved, from one TrainingJob and one set of role
configurations: in namespaces built by `tailcut run`'s builder on this host, and as
pods on the cluster the kubeconfig names, where the chart's node agent wires them
into the job's racks as it wires a TrainingJob's pods (the pods carry a job's labels
and spec config map; there is no TrainingJob object, so the operator leaves them
alone). 1 Gbit/s access links with 1% loss on both directions; --racks 2 puts ps-0 and
workers 0-1 in rack-0, workers 2-3 in rack-1 (on a cluster of two nodes, the racks on
different nodes: their PUSHes cross the spines' VXLAN). Prints per run the p99 of each,
and the medians with p99(kubernetes) / p99(tailcut run) and, with both transports,
p99(tcp) / p99(bounded-loss) on each executor. Root (the local half builds
namespaces)."""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import bl_completion, bl_net  # noqa: E402
from tailcut import features, spec  # noqa: E402
from tailcut.k8s import images, placement, resources  # noqa: E402
from tailcut.net import build, topology  # noqa: E402

WORKERS = 4
PORT = 7000
TIMEOUT_S = 300.0
ROLE_MOUNT = "/bench"


def kubectl(kubeconfig: str, *args: str, input: str | None = None,
            check: bool = True) -> str:
    out = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, *args], input=input,
                         capture_output=True, text=True, timeout=120)
    if check and out.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def bench_job(name: str, transport: str, loss: float, racks: int) -> spec.TrainingJob:
    raw = bl_net.job(name, WORKERS, loss).model_dump(by_alias=True, mode="json")
    raw["spec"]["transport"] = ({"type": "bounded-loss", "p": 0.9}
                                if transport == "bounded-loss" else {"type": transport})
    if racks == 2:
        raw["spec"]["network"]["racks"] = [{"name": "rack-0"}, {"name": "rack-1"}]
        raw["spec"]["network"]["placement"] = {
            "ps-0": "rack-0", "worker-0": "rack-0", "worker-1": "rack-0",
            "worker-2": "rack-1", "worker-3": "rack-1"}
    return spec.from_dict(raw)


def role_configs(job: spec.TrainingJob, transport: str, rounds: int) -> dict[str, dict]:
    """bl_role.py's configuration of every pod, as bl_completion.py gives it."""
    topo = topology.plan(job)
    base = {"transport": transport, "options": bl_completion.TRANSPORTS[transport],
            "host": topo.pod("ps-0").ip, "port": PORT}
    configs = {"ps-0": {**base, "role": "ps", "workers": WORKERS, "rounds": rounds}}
    for i in range(WORKERS):
        configs[f"worker-{i}"] = {**base, "role": "worker", "index": i,
                                  "elements": bl_completion.ELEMENTS}
    return configs


def completions(result: dict[str, Any]) -> list[float]:
    """Per-message completion, without the first round (it warms up: XDP compile)."""
    return [m["completion_s"] for m in result["messages"][WORKERS:]]


def run_local(job: spec.TrainingJob, configs: dict[str, dict]) -> list[float]:
    """The roles in the job's network built on this host, as `tailcut run` builds it."""
    topo = topology.plan(job)
    network = build.build(topo, features.netem().available)
    try:
        server = bl_net.start(topo.pod("ps-0"), configs["ps-0"])
        clients = [bl_net.start(topo.pod(r), c) for r, c in configs.items() if r != "ps-0"]
        result = bl_net.finish(server)
        for client in clients:
            bl_net.finish(client)
        return completions(result)
    finally:
        network.destroy()


def manifests(job: spec.TrainingJob, configs: dict[str, dict],
              nodes: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """The job's spec config map, one with bl_role.py, and the job's pods running
    bl_role.py once their address is on tc0, placed on `nodes` as the operator
    places a TrainingJob's (tailcut.k8s.placement)."""
    where = placement.place(job, namespace, placement.schedulable(nodes))
    unowned = {"apiVersion": "v1", "kind": "ConfigMap", "name": "none", "uid": "none"}
    spec_map = resources.config_map(job, unowned, where)
    del spec_map["metadata"]["ownerReferences"]
    role_map = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": f"{job.name}-bench", "labels": resources.labels(job)},
                "data": {"bl_role.py": (REPO / "bench" / "bl_role.py").read_text()}}
    pods = []
    for pod in resources.pods(job, unowned, images.ref("worker"), "Never", where):
        del pod["metadata"]["ownerReferences"]
        replica = pod["metadata"]["labels"][resources.LABEL_REPLICA]
        ip = topology.plan(job).pod(replica).ip
        container = pod["spec"]["containers"][0]
        container["command"] = ["sh", "-c"]
        container["args"] = [
            f"python -c 'from tailcut.net import address; "
            f"address.wait_for(120, \"{replica}\", ip=\"{ip}\")' && "
            f"exec python {ROLE_MOUNT}/bl_role.py '{json.dumps(configs[replica])}'"]
        container["volumeMounts"].append({"name": "bench", "mountPath": ROLE_MOUNT})
        pod["spec"]["volumes"].append({"name": "bench",
                                       "configMap": {"name": f"{job.name}-bench"}})
        pods.append(pod)
    return [spec_map, role_map, *pods]


def run_cluster(kubeconfig: str, namespace: str, job: spec.TrainingJob,
                configs: dict[str, dict]) -> list[float]:
    name = job.name
    nodes = json.loads(kubectl(kubeconfig, "get", "nodes", "-o", "json"))["items"]
    objects = manifests(job, configs, nodes, namespace)
    kubectl(kubeconfig, "-n", namespace, "apply", "-f", "-",
            input=yaml.safe_dump_all(objects))
    ps = resources.pod_name(job, "ps-0")
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            phase = json.loads(kubectl(kubeconfig, "-n", namespace, "get", "pod", ps, "-o",
                                       "json"))["status"].get("phase")
            if phase in ("Succeeded", "Failed"):
                break
            time.sleep(0.5)
        log = kubectl(kubeconfig, "-n", namespace, "logs", ps)
        if phase != "Succeeded":
            raise RuntimeError(f"{ps}: {phase}; its log ends:\n{log[-2000:]}")
        result = json.loads(log.strip().splitlines()[-1])
        return completions(result)
    finally:
        kubectl(kubeconfig, "-n", namespace, "delete", "pods,configmaps", "-l",
                f"{resources.LABEL_JOB}={name}", "--wait=true", check=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--namespace", default="tailcut-bench")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--transports", nargs="+", choices=["tcp", "udp", "bounded-loss"],
                    default=["tcp", "bounded-loss"])
    ap.add_argument("--racks", type=int, choices=[1, 2], default=1)
    args = ap.parse_args()
    loss = 0.01   # bl_completion's network
    kubectl(args.kubeconfig, "create", "namespace", args.namespace, check=False)
    p99: dict[tuple[str, str], list[float]] = {}
    for run in range(args.runs):
        for transport in args.transports:
            name = f"kpush-{'bl' if transport == 'bounded-loss' else transport}-{run}"
            job = bench_job(name, transport, loss, args.racks)
            configs = role_configs(job, transport, args.rounds)
            here = bl_net.pct(run_local(job, configs), 99)
            there = bl_net.pct(run_cluster(args.kubeconfig, args.namespace, job, configs), 99)
            p99.setdefault(("local", transport), []).append(here)
            p99.setdefault(("kubernetes", transport), []).append(there)
            print(f"run {run + 1}/{args.runs} {transport}: p99 4 MiB PUSH tailcut run "
                  f"{here * 1e3:.1f} ms, kubernetes {there * 1e3:.1f} ms", flush=True)
    med = {k: statistics.median(v) for k, v in p99.items()}
    print(f"\n4 MiB PUSH, {WORKERS} workers -> ps-0 in {args.racks} rack(s), 1 Gbit/s, loss "
          f"{loss} both ways, {args.rounds} rounds, median of {args.runs} runs:")
    for t in args.transports:
        print(f"  {t:>12}: p99 tailcut run {med[('local', t)] * 1e3:.1f} ms, kubernetes "
              f"{med[('kubernetes', t)] * 1e3:.1f} ms, p99(kubernetes) / p99(tailcut run) "
              f"= {med[('kubernetes', t)] / med[('local', t)]:.2f}")
    if {"tcp", "bounded-loss"} <= set(args.transports):
        for where in ("local", "kubernetes"):
            print(f"p99(tcp) / p99(bounded-loss) {where}: "
                  f"{med[(where, 'tcp')] / med[(where, 'bounded-loss')]:.2f}")


if __name__ == "__main__":
    main()
