"""TrainingJobs applied with kubectl run as real pods on the real node.

The chart is installed with helm from the images built here (the `release` fixture);
each test applies an example, watches the operator's pods run on the kubelet, checks
that the node agent wired them into the job's racks on the node (tc0 inside the pod's
own network namespace, with the address and shaping `tailcut run` gives it), that
the job ends Succeeded with its figures in the status, that `tailcut collect` brings
back the results a `tailcut run` leaves, and that deleting the job leaves nothing on
the node.
"""

import json
import re
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

from tailcut.k8s import collect
from tailcut.k8s.agent import podns
from tailcut.k8s.node import images
from tests.cluster import chart
from tests.k8s import test_overlay_ids
from tests.waiting import until

pytestmark = [pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]


def example(name: str, job_name: str) -> str:
    raw = yaml.safe_load((REPO / "examples" / name).read_text())
    raw["metadata"]["name"] = job_name
    return yaml.safe_dump(raw)


def tc_in_pod(pod: dict, *args: str) -> str:
    """`tc ARGS` inside the pod's network namespace, entered through one of its
    processes (found by the pod's UID in its cgroup, as the agent finds it)."""
    pid = podns.pid_of_pod(pod["metadata"]["uid"])
    if pid is None:
        return f"(no process of pod {pod['metadata']['name']} in /proc)"
    return subprocess.run(["nsenter", "-t", str(pid), "-n", "tc", *args],
                          capture_output=True, text=True).stdout


def test_helm_test_passes(cluster, release):
    out = chart.helm(cluster, "test", "tailcut", "--namespace", release, "--timeout", "3m")
    assert "Phase:          Succeeded" in out.stdout, out.stdout + out.stderr


def test_quickstart_runs_as_shaped_pods_and_its_results_come_back(cluster, release,
                                                                   namespace, tmp_path):
    cluster.kubectl("-n", namespace, "apply", "-f", "-",
                    input=example("quickstart.yaml", "qs"))
    ps = chart.wait_pod_running(cluster, namespace, "qs-ps-0")
    # The agent wires a pod once it is Running: tc0 inside the pod's own network
    # namespace, with an HTB class at the spec's 1 Gbit/s.
    assert until(lambda: "rate 1Gbit" in tc_in_pod(ps, "class", "show", "dev", "tc0"),
                 within_s=30, every_s=0.2), tc_in_pod(ps, "-s", "qdisc", "show", "dev", "tc0")
    status = chart.wait_phase(cluster, namespace, "qs", "Succeeded")
    # Both directions of every link, uplinks included, as tailcut run's network.json:
    # 5 pods (tc0 and their rack port), 2 racks (up and the spine's r<i>); and the two
    # racks on the cluster's two nodes, their spines joined by VXLAN.
    network = status["network"]
    links = {k: v for k, v in network.items() if not k.endswith("/vx0")}
    assert len(links) == 5 * 2 + 2 * 2, network
    assert network["ps-0/tc0"].startswith("htb 1000 Mbit/s") and "rack-1/up" in network
    assert all(v.startswith("htb 1000 Mbit/s") for v in links.values()), network
    assert sorted(k for k in network if k.endswith("/vx0")) == [
        "spine@tcnode-0/vx0", "spine@tcnode-1/vx0"], network
    placed = {(p["metadata"]["labels"]["tailcut.dev/rack"], p["spec"]["nodeName"])
              for p in chart.get(cluster, namespace, "pods", "-l", "tailcut.dev/job=qs")["items"]}
    racks_nodes = dict(placed)   # one node per rack, and the racks on both nodes
    assert len(placed) == 2 and set(racks_nodes.values()) == {"tcnode-0", "tcnode-1"}, placed
    # Each agent found its pods' processes: from the runtime's record where the chart
    # mounts the node's containerd state, by cgroup and container id on the other.
    for node, how in (("tcnode-0", "runtime"), ("tcnode-1", "cgroup")):
        assert re.search(rf"{namespace}/qs-\S+: process \d+, found by {how} \(container ",
                         chart.agent_log(cluster, node)), chart.agent_log(cluster, node)[-2000:]
    assert status["jctSeconds"] > 0
    assert status["accuracy"] >= 0.93
    epochs = int(status["progress"].split("/")[0])
    assert 1 <= epochs <= 30
    assert status["replicaStatuses"]["Worker"]["succeeded"] == 4
    # whether it measured the network or the host, from the PS's node's CPU
    assert status["fidelity"]["verdict"] in ("network-bound", "marginal", "host-bound")
    assert any("not sampled" in note for note in status["fidelity"]["notes"])

    results = collect.collect("qs", namespace, str(cluster.kubeconfig), tmp_path / "qs")
    metrics = json.loads((results / "metrics.json").read_text())
    assert metrics["jct_s"] == pytest.approx(status["jctSeconds"], abs=0.01)
    assert metrics["fidelity"]["verdict"] == status["fidelity"]["verdict"]
    for name in ("epochs.csv", "messages.csv", "loss.png", "spec.yaml"):
        assert (results / name).exists(), name

    cluster.kubectl("-n", namespace, "delete", "trainingjob", "qs")
    assert until(lambda: not chart.owned_objects(cluster, namespace, "qs"), within_s=60,
                 every_s=1), chart.owned_objects(cluster, namespace, "qs")


def test_cadentflow_gets_its_priority_classes_and_succeeds(cluster, release, namespace):
    # Its classes and a job that ends are what is checked here, not how far it trains:
    # 40 iterations, not the example's way to 0.9 (a minute of CI)
    raw = yaml.safe_load(example("cadentflow.yaml", "cf"))
    raw["spec"]["training"].pop("targetAccuracy")
    raw["spec"]["training"]["iterations"] = 40
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(raw))
    ps = chart.wait_pod_running(cluster, namespace, "cf-ps-0")
    # HTB priority classes under the link class, and the DSCP classifier at egress.
    assert until(lambda: "prio 0" in tc_in_pod(ps, "class", "show", "dev", "tc0"),
                 within_s=60, every_s=0.2), tc_in_pod(ps, "class", "show", "dev", "tc0")
    # (the classifier is attached after the classes: wait for it too)
    assert until(lambda: "tailcut_classif" in tc_in_pod(ps, "filter", "show", "dev", "tc0",
                                                         "egress"),
                 within_s=30, every_s=0.2), tc_in_pod(ps, "filter", "show", "dev", "tc0",
                                                      "egress")
    status = chart.wait_phase(cluster, namespace, "cf", "Succeeded", within_s=420)
    assert status["jctSeconds"] > 0
    # The classes sit on both ends of every link: the rack's port towards ps-0 too.
    assert "cadentflow" in status["network"]["rack-0/p0"], status["network"]


def test_background_load_runs_beside_the_training_and_ends_with_it(cluster, release,
                                                                     namespace):
    cluster.kubectl("-n", namespace, "apply", "-f", "-",
                    input=example("quickstart-background.yaml", "bg"))
    status = chart.wait_phase(cluster, namespace, "bg", "Succeeded", within_s=420)
    assert status["accuracy"] >= 0.93
    background = status["background"]
    assert background["servers"] and background["clients"]
    # The flow server stops once the job has ended.
    assert until(lambda: all(
        p["status"].get("phase") in ("Succeeded", "Failed")
        for p in chart.get(cluster, namespace, "pods", "-l", "tailcut.dev/job=bg")["items"]),
        within_s=120, every_s=1)


SCRAPE = """
import socket, urllib.request
def scrape(url):
    return urllib.request.urlopen(url, timeout=10).read().decode()
print("=== operator")
print(scrape("http://tailcut-operator-metrics.{ns}.svc.cluster.local:9100/metrics"))
# The agents' Service is headless, one address per node: each is scraped, as
# Prometheus does.
agents = sorted({{a[4][0] for a in socket.getaddrinfo(
    "tailcut-agent-metrics.{ns}.svc.cluster.local", 9108, proto=socket.IPPROTO_TCP)}})
for ip in agents:
    print(f"=== agent {{ip}}")
    print(scrape(f"http://{{ip}}:9108/metrics"))
"""


def metric(text: str, name: str) -> float:
    """The value of one sample line `name value` (labels included in `name`)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no sample {name} in:\n{text[:3000]}")


def test_the_operator_and_agent_metrics_are_scraped_through_the_charts_services(
        cluster, release, namespace):
    """After a job, a pod in the cluster reads both /metrics through the chart's
    Services, as Prometheus would: the job counted Succeeded, its five pods shaped."""
    cluster.kubectl("-n", namespace, "apply", "-f", "-",
                    input=example("quickstart.yaml", "qm"))
    chart.wait_phase(cluster, namespace, "qm", "Succeeded")
    scraper = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "scrape"},
               "spec": {"restartPolicy": "Never", "containers": [{
                   "name": "scrape", "image": images.ref("worker"),
                   "imagePullPolicy": "Never", "command": ["python", "-c"],
                   "args": [SCRAPE.format(ns=release)]}]}}
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(scraper))
    assert until(lambda: (chart.get(cluster, namespace, "pod", "scrape") or {}).get(
        "status", {}).get("phase") in ("Succeeded", "Failed"), within_s=120, every_s=1)
    text = cluster.kubectl("-n", namespace, "logs", "scrape").stdout
    assert chart.get(cluster, namespace, "pod", "scrape")["status"]["phase"] == "Succeeded", text
    operator_text, *agent_texts = text.split("=== operator\n")[1].split("=== agent ")
    assert metric(operator_text, 'tailcut_operator_jobs{phase="Succeeded"}') >= 1
    assert metric(operator_text, "tailcut_operator_reconcile_seconds_count") >= 1
    agents = {t.split("\n", 1)[0]: t for t in agent_texts}   # node address -> metrics
    assert set(agents) == {n.ip for n in cluster.nodes}, list(agents)
    assert sum(metric(t, "tailcut_agent_pods_shaped_total") for t in agents.values()) >= 5
    # (the kind-like node's agent refuses what test_kind_node.py sends it)
    assert all(metric(agents[n.ip], "tailcut_agent_shaping_failures_total") == 0
               for n in cluster.nodes if not n.kind_like)


def test_sharded_parameter_servers_and_an_aggregator_run_as_pods(cluster, release,
                                                                  namespace):
    """Every role of the plan as a pod (two PS shards, an aggregator in rack-1), each
    reaching its peers at their addresses on the job's links, as under `tailcut run`:
    mlfabric.yaml without its replica."""
    raw = yaml.safe_load((REPO / "examples" / "mlfabric.yaml").read_text())
    raw["metadata"]["name"] = "sh"
    raw["spec"]["replicas"].update(parameterServers=2, psReplica=False)
    placement = raw["spec"]["network"]["placement"]
    del placement["replica-0"]
    placement["ps-1"] = "rack-1"
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(raw))
    status = chart.wait_phase(cluster, namespace, "sh", "Succeeded", within_s=420)
    assert status["accuracy"] >= 0.93
    def phases():
        return {p["metadata"]["labels"]["tailcut.dev/replica"]: p["status"]["phase"]
                for p in chart.get(cluster, namespace, "pods", "-l",
                                   "tailcut.dev/job=sh")["items"]}
    # Every role ends cleanly once the PS says STOP, not only the workers.
    assert until(lambda: set(phases().values()) == {"Succeeded"}, within_s=60,
                 every_s=1), phases()
    assert {"ps-0", "ps-1", "aggregator-0"} <= set(phases())
    # The aggregator summed workers 2 and 3 for the PS shards, round after round.
    log = cluster.kubectl("-n", namespace, "logs", "sh-aggregator-0").stdout
    done = [json.loads(line) for line in log.splitlines() if "aggregator_done" in line]
    assert done and done[0]["rounds"] > 0, log[-2000:]


def test_ps_0s_pod_deleted_mid_job_its_replica_takes_over_and_the_job_completes(
        cluster, release, namespace):
    """mlfabric.yaml as it is (a PS replica, an aggregator): once ps-0 has logged its
    first epoch its pod is deleted; replica-0 takes over, as under `tailcut run`, and
    the job succeeds with the replica's figures in its status."""
    cluster.kubectl("-n", namespace, "apply", "-f", "-",
                    input=example("mlfabric.yaml", "rp"))
    chart.wait_pod_running(cluster, namespace, "rp-ps-0")
    assert until(lambda: '"event": "epoch"' in cluster.kubectl(
        "-n", namespace, "logs", "rp-ps-0", check=False).stdout, within_s=180, every_s=0.2)
    cluster.kubectl("-n", namespace, "delete", "pod", "rp-ps-0", "--wait=false")
    status = chart.wait_phase(cluster, namespace, "rp", "Succeeded", within_s=420)
    assert status["accuracy"] >= 0.93 and status["jctSeconds"] > 0
    log = cluster.kubectl("-n", namespace, "logs", "rp-replica-0").stdout
    assert '"event": "takeover"' in log, log[-3000:]
    # ps-0 is not created again; every other role ends cleanly.
    def phases():
        return {p["metadata"]["name"]: p["status"]["phase"]
                for p in chart.get(cluster, namespace, "pods", "-l",
                                   "tailcut.dev/job=rp")["items"]}
    assert until(lambda: "rp-ps-0" not in phases()
                 and set(phases().values()) == {"Succeeded"}, within_s=90, every_s=1), phases()


class Capture:
    """tcpdump on tc0 of one pod, from the moment the node agent has wired it (tc0
    exists in the pod's network namespace) until stop(): started by a thread beside
    the test, from the host, inside the pod's namespace (entered through one of its
    processes, as tc_in_pod), so it costs the test no time."""

    def __init__(self, cluster: Any, namespace: str, pod: str, path: Path) -> None:
        self.cluster, self.namespace, self.pod, self.path = cluster, namespace, pod, path
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.started_at = 0.0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._start, daemon=True)
        self.thread.start()

    def _start(self) -> None:
        deadline = time.monotonic() + 420
        while not self.stopping.is_set() and time.monotonic() < deadline:
            found = chart.get(self.cluster, self.namespace, "pod", self.pod)
            pid = found and podns.pid_of_pod(found["metadata"]["uid"])
            if pid and subprocess.run(["nsenter", "-t", str(pid), "-n", "ip", "link", "show",
                                       "tc0"], capture_output=True).returncode == 0:
                self.started_at = time.time()
                self.proc = subprocess.Popen(
                    ["nsenter", "-t", str(pid), "-n", "tcpdump", "-i", "tc0", "-nn", "-U",
                     "-s", "128", "-w", str(self.path)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                return
            self.stopping.wait(0.5)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        assert self.proc is not None and self.path.exists(), (
            f"no capture on {self.namespace}/{self.pod}'s tc0: it was never wired "
            "while the test looked")

    def times(self, expression: str) -> list[float]:
        """When each captured packet that `expression` (tcpdump's filter) matches was
        seen, in seconds since the epoch."""
        # (no check: a capture stopped mid-packet ends "truncated", after the others)
        out = subprocess.run(["tcpdump", "-r", str(self.path), "-nn", "-tt", expression],
                             capture_output=True, text=True).stdout
        return [float(line.split()[0]) for line in out.splitlines() if line.strip()]


def _overlap(window: tuple[float, float], times: list[float]) -> list[float]:
    return [t for t in times if window[0] <= t <= window[1]]


def test_a_torch_job_and_two_allreduce_jobs_run_on_the_torch_image_and_their_results_come_back(
        cluster, release, namespace, tmp_path):
    """The torch MLP through a PS, by DDP over Gloo with no PS, and by the transpose
    all-reduce over bounded-loss, side by side, two epochs each (what is checked is
    that PyTorch and the ranks' connections work in the pods, not convergence): their
    pods run the chart's torch image, all end Succeeded with their figures, and
    `tailcut collect` brings back the all-reduce reports.

    The two all-reduce jobs are named so that their <namespace>/<name> hash to the
    same 24 bits (the VXLAN id the agents once derived from it): they get different
    overlay ids, and neither job's packets reach the other's pods, both training across
    the two nodes at once. tcpdump on rank 1's tc0 of each: on the Gloo job's, no UDP
    (the transpose's datagrams); on the transpose job's, no TCP without port 7000 (Gloo's
    pairs; the transpose's control connections all end at 7000), while the other job's
    own capture shows it sending across the nodes."""
    gloo_job, transpose_job = test_overlay_ids.colliding_names(namespace, prefix="ar")
    jobs = {"torch-ps": "quickstart-torch.yaml", gloo_job: "allreduce-gloo.yaml",
            transpose_job: "allreduce-bounded-loss.yaml"}
    cluster.kubectl("label", "--overwrite", "namespace", namespace,
                    "tailcut.dev/bounded-loss=allowed")
    for job_name, name in jobs.items():
        raw = yaml.safe_load(example(name, job_name))
        raw["spec"]["training"].update({"epochs": 2, "targetAccuracy": None})
        if raw["spec"]["training"].get("syncMode") == "allreduce":
            # Two ranks, one per rack: each pod's `import torch` costs ~9 s of CPU.
            # Batches of 64 keep the 4 ranks' 63 iterations per epoch.
            raw["spec"]["replicas"]["workers"] = 2
            raw["spec"]["training"]["batchSize"] = 64
            raw["spec"]["network"]["placement"] = {"worker-0": "rack-0",
                                                   "worker-1": "rack-1"}
        cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(raw))
    captures = {job: Capture(cluster, namespace, f"{job}-worker-1", tmp_path / f"{job}.pcap")
                for job in (gloo_job, transpose_job)}
    try:
        for job_name in jobs:
            status = chart.wait_phase(cluster, namespace, job_name, "Succeeded",
                                      within_s=420)
            assert status["jctSeconds"] > 0 and status["progress"].startswith("2/"), status
            assert 0.4 < status["accuracy"] <= 1.0, status   # 4 classes: chance is 0.25
            pods = chart.get(cluster, namespace, "pods", "-l", f"tailcut.dev/job={job_name}")
            assert {p["spec"]["containers"][0]["image"] for p in pods["items"]} == {
                images.ref("worker-torch")}
    finally:
        for capture in captures.values():
            capture.stop()

    # Different overlay ids for names a 24-bit hash could not tell apart, and each
    # job's ranks on both nodes, so its rank 1 is reached through the VXLAN.
    assert test_overlay_ids.name_hash_24(f"{namespace}/{gloo_job}") == \
        test_overlay_ids.name_hash_24(f"{namespace}/{transpose_job}")
    ids = {job: chart.job_status(cluster, namespace, job)["overlayId"]
           for job in (gloo_job, transpose_job)}
    assert ids[gloo_job] != ids[transpose_job], ids
    for job in (gloo_job, transpose_job):
        nodes = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in chart.get(
            cluster, namespace, "pods", "-l", f"tailcut.dev/job={job}")["items"]}
        assert nodes[f"{job}-worker-0"] != nodes[f"{job}-worker-1"], nodes
    # Neither saw a packet of the other, and each listened while the other sent.
    own = {gloo_job: "tcp", transpose_job: "udp"}
    foreign = {gloo_job: "udp", transpose_job: "tcp and not port 7000"}
    heard = {}
    for job, other in ((gloo_job, transpose_job), (transpose_job, gloo_job)):
        capture = captures[job]
        mine = capture.times(own[job])
        assert mine, f"{job}'s capture holds none of its own packets ({own[job]})"
        assert not capture.times(foreign[job]), (
            f"{job}-worker-1's tc0 saw packets of {other} ({foreign[job]}): "
            + subprocess.run(["tcpdump", "-r", str(capture.path), "-nn", "-c", "5",
                              foreign[job]], capture_output=True, text=True).stdout)
        heard[other] = (capture.started_at, mine[-1])
    sent_while_heard = {job: _overlap(heard[job], captures[job].times(own[job]))
                        for job in (gloo_job, transpose_job)}
    assert max(len(t) for t in sent_while_heard.values()) >= 100, (
        "the two jobs did not train at the same time: "
        + ", ".join(f"{job} sent {len(t)} packets while the other listened"
                    for job, t in sent_while_heard.items()))

    gloo = {p["metadata"]["name"] for p in chart.get(
        cluster, namespace, "pods", "-l", f"tailcut.dev/job={gloo_job}")["items"]}
    assert gloo == {f"{gloo_job}-worker-{i}" for i in range(2)}   # no PS

    for job_name in (gloo_job, transpose_job):
        results = collect.collect(job_name, namespace, str(cluster.kubeconfig),
                                  tmp_path / job_name)
        metrics = json.loads((results / "metrics.json").read_text())
        assert metrics["model"] == "torch-mlp" and metrics["epochs"] == 2
        report = json.loads((results / "allreduce.json").read_text())
        assert report, f"{job_name}: empty all-reduce report"
        assert (results / "allreduce-worker-0.csv").exists()
    # The transpose's ranks received through the XDP counter, and logged each message.
    assert "XDP counter attached" in (results / "logs" / "worker-1.log").read_text()
    assert (results / "messages-worker-1.csv").stat().st_size > 0


# Run above with more checks: quickstart, cadentflow, quickstart-background, mlfabric,
# and (two epochs each) quickstart-torch, allreduce-gloo and allreduce-bounded-loss.
OTHER_EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.yaml")
                        if p.name not in ("quickstart.yaml", "cadentflow.yaml",
                                          "quickstart-background.yaml", "mlfabric.yaml",
                                          "quickstart-torch.yaml", "allreduce-gloo.yaml",
                                          "allreduce-bounded-loss.yaml"))


# How many of the examples' pods may run at once. Side by side they share the two
# cores, but each spends much of its time waiting (pods starting and being wired,
# shaped links): run one after the other they took ~10 minutes of CI. The cap keeps
# the pods within what the two nodes offer (each pod requests 100m of their 2 CPUs
# each) and every job well inside its own timeout (300 s for most).
MOST_PODS_AT_ONCE = 23


@dataclass
class Ran:
    """One example of OTHER_EXAMPLES as the cluster ran it, in a namespace of its own."""

    name: str
    loaded: Any                 # its TrainingJob, as tailcut.spec loads it
    job: str
    namespace: str
    refused: list[Any]          # what the plan refuses to run on Kubernetes
    within_s: float             # how long after it is applied it must have ended
    applied_at: float = 0.0
    status: dict[str, Any] = field(default_factory=dict)
    missed: Optional[AssertionError] = None   # it did not end as it should have

    @property
    def pods(self) -> int:
        return 0 if self.refused else len(self.loaded.spec.pod_names())

    @property
    def phase(self) -> str:
        return "Failed" if self.refused else "Succeeded"


@pytest.fixture(scope="module")
def other_examples(cluster, release):
    """Every example of OTHER_EXAMPLES applied, each in a namespace of its own, and
    waited for until it ends: side by side, as many at once as MOST_PODS_AT_ONCE
    allows, the next that fits applied as soon as one ends. By example name."""
    from tailcut import plan, spec

    todo = []
    for name in OTHER_EXAMPLES:
        loaded = spec.load_file(REPO / "examples" / name)
        refused = plan.refusals(loaded, "kubernetes")
        todo.append(Ran(name, loaded, f"ex-{name.removesuffix('.yaml')}"[:40],
                        f"ex-{uuid.uuid4().hex[:8]}", refused,
                        within_s=60 if refused else 420))
    # Refusals first (they end at once, with no pod), then the biggest jobs; a
    # smaller one starts whenever it fits in what the big ones leave.
    todo.sort(key=lambda r: r.pods, reverse=True)
    todo.sort(key=lambda r: not r.refused)
    ran = {r.name: r for r in todo}
    running: list[Ran] = []
    try:
        while todo or running:
            for r in list(todo):   # the first that fit, big before small
                if not running or sum(o.pods for o in running) + r.pods <= MOST_PODS_AT_ONCE:
                    todo.remove(r)
                    running.append(apply(cluster, r))
            time.sleep(2.0)
            for r in list(running):
                r.status = chart.job_status(cluster, r.namespace, r.job)
                ended = chart.phase_reached(r.status, r.phase)
                if ended is None and time.monotonic() < r.applied_at + r.within_s:
                    continue
                if not ended:
                    r.missed = chart.phase_missed(cluster, r.namespace, r.job, r.phase,
                                                  r.status)
                running.remove(r)
        yield ran
    finally:
        for r in ran.values():
            cluster.kubectl("delete", "namespace", r.namespace, "--wait=false", check=False)


def apply(cluster: Any, r: Ran) -> Ran:
    """Apply the example in a namespace of its own."""
    from tailcut import plan

    cluster.kubectl("create", "namespace", r.namespace)
    if plan.needs_xdp(r.loaded):   # what a cluster admin does to allow bounded-loss pods
        cluster.kubectl("label", "namespace", r.namespace, "tailcut.dev/bounded-loss=allowed")
    cluster.kubectl("-n", r.namespace, "apply", "-f", "-", input=example(r.name, r.job))
    r.applied_at = time.monotonic()
    return r


@pytest.mark.parametrize("name", OTHER_EXAMPLES)
def test_every_other_example_ends_on_the_cluster_as_under_tailcut_run(cluster,
                                                                      other_examples, name):
    """What the plan lets Kubernetes run succeeds and meets the example's accuracy
    target, as `tailcut run` of the same file does; what it refuses fails at once with
    the plan's words, creating nothing. (The examples ran side by side in the
    `other_examples` fixture; each test checks how its own ended.)"""
    ran = other_examples[name]
    if ran.missed is not None:
        raise ran.missed
    status, loaded = ran.status, ran.loaded
    if ran.refused:
        failed = {c["type"]: c for c in status["conditions"]}["Failed"]
        assert failed["reason"] == "InvalidSpec" and ran.refused[0].message in failed["message"]
        assert not chart.owned_objects(cluster, ran.namespace, ran.job)
        return
    target = loaded.spec.training.target_accuracy
    if target is not None:
        assert status["converged"] and status["accuracy"] >= target, status
    in_network = loaded.spec.network.in_network
    if in_network is not None and in_network.hot_parameters is not None:
        # the agent loaded the ToR's store
        assert "hot-parameter store" in status["network"]["rack-0/up"], status["network"]
    if in_network is not None and in_network.aggregate:   # and each rack's aggregation
        for rack in ("rack-1", "rack-2"):
            assert "aggregation (workers" in status["network"][f"{rack}/up"], status["network"]
