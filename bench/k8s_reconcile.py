"""Benchmark: how fast the operator reconciles many TrainingJobs created at once, and
whether its memory stays bounded.

Starts a real etcd + kube-apiserver on loopback (tailcut.k8s.node.devcluster), the CRD and
the chart's RBAC, and the operator (kubernetes backend) as the chart's service account.
Each round creates N TrainingJobs (1 PS + 2 workers each) in a fresh namespace in one
`kubectl apply`, and times until every job has status.phase and all 3N pods exist.
Rounds alternate N=10 and N=50, `--rounds` times each; it prints medians, the
per-job ratio of the two sizes, and the operator's RSS (VmRSS, sampled every 0.2 s)
at start, at the peak of each round and after the last round.

    .venv/bin/python bench/k8s_reconcile.py [--rounds 3] [--small 10] [--large 50]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import hostcheck  # noqa: E402
from tailcut.k8s.manifests import resources  # noqa: E402
from tailcut.k8s.node import devcluster  # noqa: E402
from tests.k8s import operator_proc  # noqa: E402

TIMEOUT_S = 300.0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.last, self.running = pid, 0, 0, True

    def run(self) -> None:
        while self.running:
            try:
                self.last = rss_kib(self.pid)
            except OSError:
                return
            self.peak = max(self.peak, self.last)
            time.sleep(0.2)

    def reset_peak(self) -> None:
        self.peak = self.last


def jobs_yaml(count: int, round_no: int) -> str:
    docs = [{"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
             "metadata": {"name": f"k8-b{round_no}-{i}"},
             "spec": {"replicas": {"workers": 2}}} for i in range(count)]
    return yaml.safe_dump_all(docs)


def one_round(cp: devcluster.ControlPlane, count: int, round_no: int) -> float:
    ns = f"k8-bench-{round_no}"
    cp.kubectl("create", "namespace", ns)
    cp.kubectl("-n", ns, "create", "serviceaccount", "default")
    start = time.monotonic()
    cp.kubectl("-n", ns, "apply", "-f", "-", input=jobs_yaml(count, round_no))
    while time.monotonic() - start < TIMEOUT_S:
        jobs = json.loads(cp.kubectl("-n", ns, "get", "trainingjobs", "-o", "json").stdout)
        with_status = sum(1 for j in jobs["items"] if (j.get("status") or {}).get("phase"))
        if with_status == count:
            pods = cp.kubectl("-n", ns, "get", "pods", "-l", resources.LABEL_JOB, "-o",
                              "name").stdout.split()
            if len(pods) == 3 * count:
                return time.monotonic() - start
        time.sleep(0.2)
    raise SystemExit(f"round {round_no}: {count} jobs not reconciled in {TIMEOUT_S} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--large", type=int, default=50)
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    watch = hostcheck.before(args)
    work = Path(tempfile.mkdtemp(prefix="tailcut-k8s-bench-"))
    with devcluster.ControlPlane.start(work / "cp") as cp:
        cp.kubectl("apply", "--server-side", "-f", str(REPO / "manifests" / "crd.yaml"))
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                   "crd/trainingjobs.tailcut.dev")
        rendered = subprocess.run(
            [str(devcluster.helm_binary()), "template", "tailcut", str(REPO / "helm" / "tailcut"),
             "--namespace", "k8-bench-system", "--set", "agent.enabled=false",
             "--set", "tests.enabled=false"], capture_output=True, text=True, check=True).stdout
        cp.kubectl("create", "namespace", "k8-bench-system")
        rbac = [d for d in yaml.safe_load_all(rendered)
                if d and d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
        token = cp.kubectl("-n", "k8-bench-system", "create", "token", "tailcut-operator",
                           "--duration=2h").stdout.strip()
        log = work / "operator.log"
        proc = operator_proc.start(cp.user_kubeconfig("op", token), log)
        try:
            time.sleep(3)  # let kopf start its watches
            sampler = RssSampler(proc.pid)
            sampler.start()
            time.sleep(0.5)
            rss_start = sampler.last
            times: dict[int, list[float]] = {args.small: [], args.large: []}
            peaks: list[int] = []
            round_no = 0
            for _ in range(args.rounds):
                for count in (args.small, args.large):
                    sampler.reset_peak()
                    seconds = one_round(cp, count, round_no)
                    peaks.append(sampler.peak)
                    times[count].append(seconds)
                    print(f"round {round_no}: {count:>3} jobs reconciled in {seconds:6.2f} s, "
                          f"operator peak RSS {sampler.peak / 1024:.1f} MiB", flush=True)
                    round_no += 1
            time.sleep(2)
            rss_end = sampler.last
            sampler.running = False
        finally:
            operator_proc.stop(proc)
    small, large = statistics.median(times[args.small]), statistics.median(times[args.large])
    print(f"\nmedian over {args.rounds} rounds: {args.small} jobs {small:.2f} s "
          f"({small / args.small * 1000:.0f} ms/job), {args.large} jobs {large:.2f} s "
          f"({large / args.large * 1000:.0f} ms/job)")
    print(f"per-job time ratio {args.large} vs {args.small} jobs: "
          f"{(large / args.large) / (small / args.small):.2f}")
    print(f"operator RSS: {rss_start / 1024:.1f} MiB at start, peaks "
          f"{', '.join(f'{p / 1024:.1f}' for p in peaks)} MiB, {rss_end / 1024:.1f} MiB after "
          f"{round_no} rounds ({args.rounds * (args.small + args.large)} jobs)")
    hostcheck.after(watch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
