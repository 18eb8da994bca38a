"""Faults on the real node: the agent's pod or the operator's pod deleted mid-job.

Their controllers (DaemonSet, Deployment) start new ones; the job must still end
Succeeded (or Failed with a condition naming why), with exactly the pods it should
have, and deleting it must leave no pod behind and no tailcut BPF program loaded.
"""

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.cluster import chart
from tests.waiting import until

pytestmark = [pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]
QUICKSTART_PODS = {"ps-0", "worker-0", "worker-1", "worker-2", "worker-3"}


def longer_quickstart(name: str) -> str:
    """The quickstart with a target it won't reach early, so the job is still running
    when the fault hits: a fixed number of epochs."""
    raw = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    raw["metadata"]["name"] = name
    raw["spec"]["training"].pop("targetAccuracy")
    raw["spec"]["training"]["epochs"] = 6
    return yaml.safe_dump(raw)


def component_pod(cluster, component: str) -> str:
    pods = chart.get(cluster, chart.RELEASE_NS, "pods", "-l",
                     f"app.kubernetes.io/component={component}")["items"]
    running = [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"
               and not p["metadata"].get("deletionTimestamp")]
    assert running, f"no running {component} pod: {json.dumps(pods)[:2000]}"
    return running[0]


def tailcut_programs() -> list[str]:
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True,
                         check=True).stdout
    return [p.get("name", "") for p in json.loads(out) if "tailcut" in p.get("name", "")]


@pytest.mark.parametrize("component", ["agent", "operator"])
def test_job_survives_its_component_pod_being_deleted(cluster, release, namespace,
                                                      component):
    job = f"fault-{component}"
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=longer_quickstart(job))
    chart.wait_pod_running(cluster, namespace, f"{job}-worker-3")
    victim = component_pod(cluster, component)
    cluster.kubectl("-n", chart.RELEASE_NS, "delete", "pod", victim, "--wait=false")

    status = chart.wait_phase(cluster, namespace, job, "Succeeded", within_s=420)
    assert status["replicaStatuses"]["Worker"]["succeeded"] == 4
    pods = chart.get(cluster, namespace, "pods", "-l", f"tailcut.dev/job={job}")["items"]
    names = sorted(p["metadata"]["name"] for p in pods)
    assert names == sorted(f"{job}-{r}" for r in QUICKSTART_PODS), "duplicate children"
    # The controller replaced the deleted pod.
    assert until(lambda: component_pod(cluster, component) != victim, within_s=120,
                 every_s=1)

    cluster.kubectl("-n", namespace, "delete", "trainingjob", job)
    assert until(lambda: not chart.owned_objects(cluster, namespace, job), within_s=60,
                 every_s=1), chart.owned_objects(cluster, namespace, job)
    assert until(lambda: not tailcut_programs(), within_s=30, every_s=1), tailcut_programs()


def agent_pod_on(cluster, node: str) -> dict:
    pods = chart.get(cluster, chart.RELEASE_NS, "pods", "-l",
                     "app.kubernetes.io/component=agent")["items"]
    return next(p for p in pods if p["spec"]["nodeName"] == node
                and not p["metadata"].get("deletionTimestamp"))


def test_an_agent_restart_rewires_a_bounded_loss_job_and_the_outage_is_measured(
        cluster, release, namespace):
    """The agent on ps-0's node is deleted mid-job: it releases its pods (their tc0
    goes), the DaemonSet's new agent wires them again. The job must still succeed; the
    outage (deletion to ps-0 wired again, from the new agent's log) is printed for
    docs/kubernetes.md."""
    import datetime
    import time

    cluster.kubectl("label", "namespace", namespace, "tailcut.dev/bounded-loss=allowed")
    raw = yaml.safe_load(longer_quickstart("rewire"))
    raw["spec"]["transport"] = {"type": "bounded-loss", "p": 0.9}
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(raw))
    ps = chart.wait_pod_running(cluster, namespace, "rewire-ps-0")
    assert until(lambda: '"event": "epoch"' in cluster.kubectl(
        "-n", namespace, "logs", "rewire-ps-0", check=False).stdout, within_s=180,
        every_s=0.5)
    node = ps["spec"]["nodeName"]
    victim = agent_pod_on(cluster, node)["metadata"]["name"]
    deleted_at = datetime.datetime.now()
    started = time.monotonic()
    cluster.kubectl("-n", chart.RELEASE_NS, "delete", "pod", victim, "--wait=false")

    def rewired_at():
        try:
            name = agent_pod_on(cluster, node)["metadata"]["name"]
        except StopIteration:
            return None
        if name == victim:
            return None
        log = cluster.kubectl("-n", chart.RELEASE_NS, "logs", name, check=False).stdout
        for line in log.splitlines():
            if f"{namespace}/rewire-ps-0: " in line and "htb" in line:
                return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        return None
    assert until(lambda: rewired_at() is not None, within_s=180, every_s=1)
    outage_s = (rewired_at() - deleted_at).total_seconds()
    status = chart.wait_phase(cluster, namespace, "rewire", "Succeeded", within_s=420)
    print(f"\nagent restart on {node}: ps-0 wired again {outage_s:.1f} s after the old "
          f"agent's pod was deleted; job Succeeded {time.monotonic() - started:.0f} s after "
          f"the deletion, JCT {status['jctSeconds']} s, accuracy {status['accuracy']}")
    assert status["replicaStatuses"]["Worker"]["succeeded"] == 4
    assert outage_s < 120, outage_s
