"""TrainingJobs applied with kubectl run as real pods on the real node.

The chart is installed with helm from the images built here (the `release` fixture);
each test applies an example, watches the operator's pods run on the kubelet, checks
that the node agent shaped them (`tc` inside the pod's own network namespace), that
the job ends Succeeded with its figures in the status, that `tailcut collect` brings
back the results a `tailcut run` leaves, and that deleting the job leaves nothing on
the node.
"""

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tailcut.k8s import agent, collect
from tests.cluster import chart
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
    pid = agent.pid_of_pod(pod["metadata"]["uid"])
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
    # The agent shapes a pod once it is Running: an HTB class at the spec's 1 Gbit/s on
    # eth0 inside the pod's own network namespace.
    assert until(lambda: "rate 1Gbit" in tc_in_pod(ps, "class", "show", "dev", "eth0"),
                 within_s=30, every_s=0.2), tc_in_pod(ps, "-s", "qdisc", "show", "dev", "eth0")
    status = chart.wait_phase(cluster, namespace, "qs", "Succeeded")
    assert status["jctSeconds"] > 0
    assert status["accuracy"] >= 0.93
    epochs = int(status["progress"].split("/")[0])
    assert 1 <= epochs <= 30
    assert status["replicaStatuses"]["Worker"]["succeeded"] == 4

    results = collect.collect("qs", namespace, str(cluster.kubeconfig), tmp_path / "qs")
    metrics = json.loads((results / "metrics.json").read_text())
    assert metrics["jct_s"] == pytest.approx(status["jctSeconds"], abs=0.01)
    for name in ("epochs.csv", "messages.csv", "loss.png", "spec.yaml"):
        assert (results / name).exists(), name

    cluster.kubectl("-n", namespace, "delete", "trainingjob", "qs")
    assert until(lambda: not chart.owned_objects(cluster, namespace, "qs"), within_s=60,
                 every_s=1), chart.owned_objects(cluster, namespace, "qs")


def test_cadentflow_gets_its_priority_classes_and_succeeds(cluster, release, namespace):
    cluster.kubectl("-n", namespace, "apply", "-f", "-",
                    input=example("cadentflow.yaml", "cf"))
    ps = chart.wait_pod_running(cluster, namespace, "cf-ps-0")
    # HTB priority classes under the link class, and the DSCP classifier at egress.
    assert until(lambda: "prio 0" in tc_in_pod(ps, "class", "show", "dev", "eth0"),
                 within_s=60, every_s=0.2), tc_in_pod(ps, "class", "show", "dev", "eth0")
    assert "tailcut_classif" in tc_in_pod(ps, "filter", "show", "dev", "eth0", "egress")
    status = chart.wait_phase(cluster, namespace, "cf", "Succeeded", within_s=420)
    assert status["jctSeconds"] > 0


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
