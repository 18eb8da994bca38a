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
into the job's racks as it wires a TrainingJob's pods. The agent wires only pods a
TrainingJob controls, built from that job (tailcut.k8s.agent.admission), so the bench makes
the TrainingJob, records its placement in its status as the operator would, and makes
the pods controlled by it; the chart's operator, whose pods these are not, is scaled
to zero meanwhile (--operator-namespace) and back afterwards. 1 Gbit/s access links with 1% loss on both directions; --racks 2 puts ps-0 and
workers 0-1 in rack-0, workers 2-3 in rack-1 (on a cluster of two nodes, the racks on
different nodes: their PUSHes cross the spines' VXLAN). Prints per run the p99 of each,
and the medians with p99(kubernetes) / p99(tailcut run) and, with both transports,
p99(tcp) / p99(bounded-loss) on each executor, each ratio marked with both sides'
verdicts (bench/README.md): a local run's judged from the host's CPU over it (links
not sampled), a cluster run's "unmeasured" (its pods are not this process's: the
host's other processes would include them), so no ratio with a cluster side is "met".
The cluster's own daemons count among the other processes of the busy-host check.
Root (the local half builds namespaces)."""

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import bl_completion, bl_net, hostcheck  # noqa: E402
from tailcut import features, spec  # noqa: E402
from tailcut.k8s.manifests import placement, resources  # noqa: E402
from tailcut.k8s.node import images  # noqa: E402
from tailcut.datapath import dropper  # noqa: E402
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
    network = build.build(topo, features.netem().available, droppers=dropper)
    try:
        server = bl_net.start(topo.pod("ps-0"), configs["ps-0"])
        clients = [bl_net.start(topo.pod(r), c) for r, c in configs.items() if r != "ps-0"]
        result = bl_net.finish(server)
        for client in clients:
            bl_net.finish(client)
        return completions(result)
    finally:
        network.destroy()


def manifests(job: spec.TrainingJob, configs: dict[str, dict], where: placement.Placement,
              owner: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's spec config map, one with bl_role.py, and the job's pods running
    bl_role.py once their address is on tc0, on the nodes of `where`, all controlled
    by the TrainingJob `owner` names."""
    spec_map = resources.config_map(job, owner)
    role_map = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": f"{job.name}-bench", "labels": resources.labels(job),
                             "ownerReferences": [owner]},
                "data": {"bl_role.py": (REPO / "bench" / "bl_role.py").read_text()}}
    pods = []
    for pod in resources.pods(job, owner, images.ref("worker"), "Never", where):
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
    # Placed as the operator places a TrainingJob's racks (tailcut.k8s.manifests.placement) and
    # recorded where the agents read it, the job's status.
    where = placement.place(job, namespace, placement.schedulable(nodes))
    raw = job.model_dump(by_alias=True, mode="json")
    kubectl(kubeconfig, "-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(
        {"apiVersion": raw["apiVersion"], "kind": raw["kind"], "metadata": {"name": name},
         "spec": raw["spec"]}))
    ps = resources.pod_name(job, "ps-0")
    try:
        tj = json.loads(kubectl(kubeconfig, "-n", namespace, "get", "trainingjob", name,
                                "-o", "json"))
        kubectl(kubeconfig, "-n", namespace, "patch", "trainingjob", name,
                "--subresource=status", "--type=merge", "-p", json.dumps({"status": {
                    "specGeneration": tj["metadata"]["generation"],
                    "placement": placement.to_status(where)}}))
        objects = manifests(job, configs, where, resources.owner_reference(tj))
        kubectl(kubeconfig, "-n", namespace, "apply", "-f", "-",
                input=yaml.safe_dump_all(objects))
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
        kubectl(kubeconfig, "-n", namespace, "delete", "trainingjob", name, check=False)
        kubectl(kubeconfig, "-n", namespace, "delete", "pods,configmaps", "-l",
                f"{resources.LABEL_JOB}={name}", "--wait=true", check=False)


@contextlib.contextmanager
def operator_stopped(kubeconfig: str, namespace: str) -> Iterator[None]:
    """The chart's operator scaled to zero (it would make its own pods for the bench's
    TrainingJobs), and back to its replicas afterwards."""
    deploy = ("-n", namespace, "deployment", "tailcut-operator")
    replicas = kubectl(kubeconfig, "get", *deploy, "-o", "jsonpath={.spec.replicas}")
    kubectl(kubeconfig, "scale", *deploy, "--replicas=0")
    try:
        kubectl(kubeconfig, "-n", namespace, "wait", "--for=delete", "pod", "-l",
                "app.kubernetes.io/component=operator", "--timeout=120s", check=False)
        yield
    finally:
        kubectl(kubeconfig, "scale", *deploy, f"--replicas={replicas or 1}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--namespace", default="tailcut-bench")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--transports", nargs="+", choices=["tcp", "udp", "bounded-loss"],
                    default=["tcp", "bounded-loss"])
    ap.add_argument("--racks", type=int, choices=[1, 2], default=1)
    ap.add_argument("--operator-namespace", default="tailcut-system",
                    help="where the chart's operator runs (stopped while the bench runs)")
    hostcheck.add_arguments(ap)
    args = ap.parse_args()
    watch = hostcheck.before(args)
    loss = 0.01   # bl_completion's network
    kubectl(args.kubeconfig, "create", "namespace", args.namespace, check=False)
    p99: dict[tuple[str, str], list[float]] = {}
    verdicts: dict[tuple[str, str], list[str]] = {}
    with operator_stopped(args.kubeconfig, args.operator_namespace):
        for run in range(args.runs):
            for transport in args.transports:
                name = f"kpush-{'bl' if transport == 'bounded-loss' else transport}-{run}"
                job = bench_job(name, transport, loss, args.racks)
                configs = role_configs(job, transport, args.rounds)
                run_watch = hostcheck.Watch()
                here = bl_net.pct(run_local(job, configs), 99)
                fidelity = hostcheck.judged(run_watch.stop())
                verdicts.setdefault(("local", transport), []).append(
                    hostcheck.verdict_of(fidelity))
                verdicts.setdefault(("kubernetes", transport), []).append(
                    hostcheck.verdict_of(None))
                there = bl_net.pct(run_cluster(args.kubeconfig, args.namespace, job,
                                               configs), 99)
                p99.setdefault(("local", transport), []).append(here)
                p99.setdefault(("kubernetes", transport), []).append(there)
                print(f"run {run + 1}/{args.runs} {transport}: p99 4 MiB PUSH tailcut run "
                      f"{here * 1e3:.1f} ms ({hostcheck.during(fidelity)}), kubernetes "
                      f"{there * 1e3:.1f} ms", flush=True)
    med = {k: statistics.median(v) for k, v in p99.items()}
    print(f"\n4 MiB PUSH, {WORKERS} workers -> ps-0 in {args.racks} rack(s), 1 Gbit/s, loss "
          f"{loss} both ways, {args.rounds} rounds, median of {args.runs} runs:")
    for t in args.transports:
        print(f"  {t:>12}: p99 tailcut run {med[('local', t)] * 1e3:.1f} ms, kubernetes "
              f"{med[('kubernetes', t)] * 1e3:.1f} ms, p99(kubernetes) / p99(tailcut run) "
              f"= {med[('kubernetes', t)] / med[('local', t)]:.2f} "
              + hostcheck.mark({f"{w} {t}": verdicts[(w, t)] for w in ("kubernetes", "local")}))
    if {"tcp", "bounded-loss"} <= set(args.transports):
        for where in ("local", "kubernetes"):
            print(f"p99(tcp) / p99(bounded-loss) {where}: "
                  f"{med[(where, 'tcp')] / med[(where, 'bounded-loss')]:.2f} "
                  + hostcheck.mark({t: verdicts[(where, t)] for t in ("tcp", "bounded-loss")}))
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
