"""Faults on the real node: the agent's pod or the operator's pod deleted mid-job, the
agent's process killed mid-job.

Their controllers (DaemonSet, Deployment) start new ones; the job must still end
Succeeded (or Failed with a condition naming why), with exactly the pods it should
have, and deleting it must leave no pod behind and no tailcut BPF program loaded.
"""

import json
import re
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


def agent_process(node: str) -> int:
    """The host's id of the agent process serving `node` (its pod shares the host's
    PID namespace); not its holder's."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue   # not a process, or gone meanwhile
        if b"tailcut.k8s.agent" in argv and f"NODE_NAME={node}".encode() in env:
            return int(entry.name)
    raise AssertionError(f"no agent process of node {node}")


def in_pod(cluster, namespace: str, pod: str, *argv: str) -> str:
    return cluster.kubectl("-n", namespace, "exec", pod, "--", *argv).stdout.strip()


def test_an_agent_killed_mid_job_leaves_the_links_and_the_next_one_adopts_them(
        cluster, release, namespace):
    """The agent on ps-0's node is killed outright, as the OOM killer would: the holder
    beside it keeps the job's racks (and so every pod's tc0), the kubelet starts the
    agent's container again, and the new agent adopts the fabric and the pods as they
    are: no link is made again, and the bounded-loss job goes on and succeeds."""
    import os
    import signal

    cluster.kubectl("label", "namespace", namespace, "tailcut.dev/bounded-loss=allowed")
    raw = yaml.safe_load(longer_quickstart("keep"))
    raw["spec"]["transport"] = {"type": "bounded-loss", "p": 0.9}
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(raw))
    ps = chart.wait_pod_running(cluster, namespace, "keep-ps-0")
    assert until(lambda: '"event": "epoch"' in cluster.kubectl(
        "-n", namespace, "logs", "keep-ps-0", check=False).stdout, within_s=180,
        every_s=0.5)
    node = ps["spec"]["nodeName"]
    victim = agent_pod_on(cluster, node)
    tc0 = in_pod(cluster, namespace, "keep-ps-0", "cat", "/sys/class/net/tc0/ifindex")
    os.kill(agent_process(node), signal.SIGKILL)

    def restarted_log():
        pod = agent_pod_on(cluster, node)
        assert pod["metadata"]["uid"] == victim["metadata"]["uid"], "the agent's pod went"
        agent = next(c for c in pod["status"]["containerStatuses"] if c["name"] == "agent")
        if agent["restartCount"] < 1 or "running" not in agent["state"]:
            return ""
        return cluster.kubectl("-n", chart.RELEASE_NS, "logs", "-c", "agent",
                               pod["metadata"]["name"], check=False).stdout
    assert until(lambda: f"{namespace}/keep-ps-0: adopted as wired" in restarted_log(),
                 within_s=120, every_s=1), restarted_log()[-3000:]
    log = restarted_log()
    assert re.search(rf"{namespace}/keep-ps-0: process \d+, found by \w+ \(container ",
                     log), log[-3000:]
    assert f"{namespace}/keep: adopted the spine and the racks" in log
    assert f"{namespace}/keep: built the spine" not in log
    assert in_pod(cluster, namespace, "keep-ps-0", "cat", "/sys/class/net/tc0/ifindex") \
        == tc0, "ps-0's tc0 was made again"
    # Before the kill, the first agent said how it found ps-0's process: from the
    # runtime's record on the node whose containerd state the chart mounts, else by
    # cgroup and container id.
    before = cluster.kubectl("-n", chart.RELEASE_NS, "logs", "-c", "agent", "--previous",
                             victim["metadata"]["name"]).stdout
    how = "runtime" if node == chart.RUNTIME_NODE else "cgroup"
    assert re.search(rf"{namespace}/keep-ps-0: process \d+, found by {how} \(container ",
                     before), before[-3000:]
    status = chart.wait_phase(cluster, namespace, "keep", "Succeeded", within_s=420)
    assert status["replicaStatuses"]["Worker"]["succeeded"] == 4
    print(f"\nagent killed on {node}: the new agent adopted the job's links; JCT "
          f"{status['jctSeconds']} s, accuracy {status['accuracy']}")
