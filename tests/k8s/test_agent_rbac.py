"""The node agent, running as the chart's agent service account against a real API
server, finds the tailcut pods of its node, checks and reads the TrainingJob that
controls them, wires them and records their links on the pod (through its status
subresource); the audit log proves its ClusterRole lacks nothing and grants nothing it
does not use. (No kubelet runs here: the pods' processes are
faked, tests/k8s/fakepod.py.)"""

import contextlib
import json
import os
import subprocess
import sys

import yaml

import pytest

from tailcut import spec
from tailcut.k8s.manifests import resources
from tests.k8s import audit, fakepod, operator_proc
from tests.k8s.conftest import RELEASE_NS

pytestmark = pytest.mark.k8s
AGENT_USER = f"system:serviceaccount:{RELEASE_NS}:tailcut-agent"


def test_agent_wires_its_nodes_pods_with_exactly_the_charts_rbac(control_plane, release,
                                                                 namespace, tmp_path):
    with contextlib.ExitStack() as stack:
        run_agent(control_plane, release, namespace, tmp_path, stack)


def run_agent(control_plane, release, namespace, tmp_path, stack):
    # A TrainingJob with its status recorded as the operator records it (no operator
    # runs here), and two of its pods as the operator makes them.
    control_plane.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(
        {"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
         "metadata": {"name": "k8-ag"}, "spec": {}}))
    tj = operator_proc.get_json(control_plane, "-n", namespace, "get", "trainingjob", "k8-ag")
    control_plane.kubectl("-n", namespace, "patch", "trainingjob", "k8-ag",
                          "--subresource=status", "--type=merge", "-p", json.dumps(
                              {"status": {"specGeneration": tj["metadata"]["generation"],
                                          "placement": {}}}))
    job = spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                          "metadata": {"name": "k8-ag"}, "spec": {}})
    pods = [p for p in resources.pods(job, resources.owner_reference(tj), "tailcut/worker:test")
            if p["metadata"]["name"] in ("k8-ag-ps-0", "k8-ag-worker-0")]
    for pod in pods:
        pod["spec"]["nodeName"] = "k8-node-a"      # as if scheduled there
    control_plane.kubectl("-n", namespace, "apply", "-f", "-",
                          input=yaml.safe_dump_all(pods))
    # ps-0 has a process (faked) to find; worker-0 has none yet.
    uid = operator_proc.get_json(control_plane, "-n", namespace, "get", "pod",
                                 "k8-ag-ps-0")["metadata"]["uid"]
    make_pod = stack.enter_context(fakepod.Maker())
    make_pod("ps-0", uid)
    for name in ("k8-ag-ps-0", "k8-ag-worker-0"):
        control_plane.kubectl("-n", namespace, "patch", "pod", name, "--subresource=status",
                              "--type=merge", "-p", json.dumps({"status": {"phase": "Running"}}))
    token = control_plane.kubectl("-n", release, "create", "token", "tailcut-agent").stdout.strip()
    log = tmp_path / "agent.log"
    env = {**os.environ, "KUBECONFIG": str(control_plane.user_kubeconfig("agent", token)),
           "NODE_NAME": "k8-node-a"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tailcut.k8s.agent"], stdout=out,
                                stderr=subprocess.STDOUT, env=env)
    try:
        operator_proc.wait_for(lambda: "no process found" in log.read_text(), 60,
                               "the agent to see the pods", log)
        operator_proc.wait_for(lambda: resources.ANNOTATION_NETWORK in (operator_proc.get_json(
            control_plane, "-n", namespace, "get", "pod", "k8-ag-ps-0")["metadata"]
            .get("annotations") or {}), 60, "the agent to record ps-0's links", log)
    finally:
        operator_proc.stop(proc)
    annotations = operator_proc.get_json(control_plane, "-n", namespace, "get", "pod",
                                         "k8-ag-ps-0")["metadata"]["annotations"]
    assert resources.ANNOTATION_QUEUE_DROPS in annotations, "recorded as it let ps-0 go"
    text = log.read_text()
    assert f"{namespace}/k8-ag-worker-0: running but no process found" in text
    assert f"{namespace}/k8-ag-ps-0: ps-0/tc0: htb 1000 Mbit/s" in text, text
    assert f"{namespace}/k8-ag-ps-0: released ps-0" in text, "SIGTERM released it"
    events = audit.requests_by(control_plane, AGENT_USER)
    assert not audit.denied(events), f"the agent's ClusterRole lacks: {audit.denied(events)}"
    unused = audit.granted(control_plane, "tailcut-agent") - audit.used(events)
    assert not unused, f"the agent's ClusterRole grants what it never used: {unused}"
