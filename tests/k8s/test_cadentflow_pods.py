"""A cadentflow job's PS and worker, run by the worker image's entrypoint from the files
the operator's config map gives them, in two pod namespaces the node agent has wired
into the job's rack: the agent's classifiers on each pod's tc0 see the roles'
per-tensor DSCP tags, as the local runtime's do, and the agent leaves nothing behind
when the pods finish."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tailcut import spec
from tailcut.k8s.manifests import resources
from tailcut.scheduling import flowreport
from tests.k8s import fakepod
from tests.k8s.test_agent import in_pod, make_agent, pod_event, prog_unloaded, tc_state

pytestmark = [pytest.mark.netns, pytest.mark.bpf, pytest.mark.e2e]
REPO = Path(__file__).resolve().parents[2]
OWNER = {"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob", "name": "ks-pods",
         "uid": "1234", "controller": True, "blockOwnerDeletion": True}
JOB = """\
apiVersion: tailcut.dev/v1alpha1
kind: TrainingJob
metadata: {name: ks-pods}
spec:
  replicas: {workers: 1}
  training: {model: deep-mlp, batchSize: 64, learningRate: 0.1, epochs: 1,
             iterations: 15, timeoutS: 60}
  network: {accessLink: {bandwidth: 200Mbit}}
  scheduling: {policy: cadentflow, priorityLevels: 4}
"""


def run_role(ns, replica, mount, results):
    """The pod's container: the entrypoint with the config map mounted, in the pod's
    network namespace (where the agent put its address on tc0)."""
    env = {**os.environ, "TAILCUT_RESULTS_DIR": str(results), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO)}
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable,
                             str(REPO / "workers" / "entrypoint.py"), "--spec",
                             str(mount / resources.SPEC_KEY), "--replica", replica],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def test_pods_tag_their_tensors_and_the_agents_classifier_sorts_them(tmp_path):
    job = spec.load_text(JOB)
    data = resources.config_map(job, OWNER)["data"]   # what the operator stores
    mount = tmp_path / "etc-tailcut"
    mount.mkdir()
    for key, text in data.items():
        (mount / key).write_text(text)

    node_agent = make_agent(job, node="ks-node")
    with fakepod.Maker() as make:
        pods = {r: make(r) for r in ("ps-0", "worker-0")}
        try:
            for pod in pods.values():
                node_agent.handle("ADDED", pod_event(pod, "Running", "ks-pods"))
            ps_wired = node_agent.wired[pods["ps-0"].uid]
            worker_wired = node_agent.wired[pods["worker-0"].uid]
            prog_ids = {i for p in pods.values() for _, i in tc_state(p.name, "tc0")[2]}

            results = tmp_path / "results"
            results.mkdir()
            roles = [run_role(pods[r].name, r, mount, results) for r in ("ps-0", "worker-0")]
            outputs = [p.communicate(timeout=120)[0] for p in roles]
            assert [p.returncode for p in roles] in ([0, 0], [0, 1], [1, 1]), outputs
            # (1 = finished without reaching a target accuracy; this job sets none)

            def sent_bytes(wired):   # per level, out of the pod's own tc0
                counts = wired.enforcement.counts()[f"{wired.name}/tc0"]
                return {lvl: b for lvl, (_, b) in counts.items()}
            ps_bytes, w_bytes = sent_bytes(ps_wired), sent_bytes(worker_wired)
        finally:
            for pod in pods.values():
                node_agent.handle("DELETED", pod_event(pod, "Succeeded", "ks-pods"))

        levels = flowreport.role_flows(job)
        fc3 = levels["pull"]["fc3.weight"]
        # PARAMS go out of the PS's tc0 one tagged part per tensor: every level is
        # seen, and fc3.weight (83% of the model) puts most bytes at its level.
        assert all(ps_bytes[lvl] > 0 for lvl in range(4)), ps_bytes
        assert ps_bytes[fc3] > 0.5 * sum(ps_bytes.values()), ps_bytes
        # PUSHes leave the worker's tc0 tagged the same way.
        assert w_bytes[levels["push"]["fc3.weight"]] > 0.5 * sum(w_bytes.values()), w_bytes
        with (results / "flows-worker-0.csv").open() as f:
            rows = list(csv.DictReader(f))
        assert {r["layer"]: int(r["level"]) for r in rows} == levels["pull"]

        for pod in pods.values():
            assert "tc0" not in in_pod(pod, "ip", "link"), "the agent left tc0 behind"
        assert prog_ids and all(prog_unloaded(i) for i in prog_ids)
