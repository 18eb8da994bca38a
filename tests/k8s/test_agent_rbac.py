"""The node agent, running as the chart's agent service account against a real API
server, finds the tailcut pods of its node and reads their job's spec; the audit log
proves its ClusterRole lacks nothing and grants nothing it does not use. (No kubelet
runs here, so the pod has no process: the agent says so and shapes nothing.)"""

import json
import os
import subprocess
import sys

import yaml

import pytest

from tailcut import spec
from tailcut.k8s import resources
from tests.k8s import audit, operator_proc
from tests.k8s.conftest import RELEASE_NS

pytestmark = pytest.mark.k8s
AGENT_USER = f"system:serviceaccount:{RELEASE_NS}:tailcut-agent"


def test_agent_reads_its_nodes_pods_with_exactly_the_charts_rbac(control_plane, release,
                                                                 namespace, tmp_path):
    job = spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                          "metadata": {"name": "k8-ag"}, "spec": {}})
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "x"}
    cm = resources.config_map(job, owner)
    del cm["metadata"]["ownerReferences"]
    (pod,) = [p for p in resources.pods(job, owner, "tailcut/worker:test")
              if p["metadata"]["name"] == "k8-ag-ps-0"]
    del pod["metadata"]["ownerReferences"]
    pod["spec"]["nodeName"] = "k8-node-a"      # as if scheduled there
    control_plane.kubectl("-n", namespace, "apply", "-f", "-",
                          input=yaml.safe_dump_all([cm, pod]))
    control_plane.kubectl("-n", namespace, "patch", "pod", "k8-ag-ps-0", "--subresource=status",
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
                               "the agent to see the pod", log)
    finally:
        operator_proc.stop(proc)
    assert f"{namespace}/k8-ag-ps-0: running but no process found" in log.read_text()
    events = audit.requests_by(control_plane, AGENT_USER)
    assert not audit.denied(events), f"the agent's ClusterRole lacks: {audit.denied(events)}"
    unused = audit.granted(control_plane, "tailcut-agent") - audit.used(events)
    assert not unused, f"the agent's ClusterRole grants what it never used: {unused}"
