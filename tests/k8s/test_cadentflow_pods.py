"""A cadentflow job's PS and worker, run by the worker image's entrypoint from the files
the operator's config map gives them, in two pod namespaces the node agent has shaped:
the agent's classifier on each pod's eth0 sees the roles' per-tensor DSCP tags, as the
local runtime's does, and the agent leaves nothing behind when the pods finish."""

import csv
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from tailcut import spec
from tailcut.k8s import agent, resources
from tailcut.scheduling import flowreport
from tests.datapath import udp_link
from tests.k8s.test_agent import BARE, CGROUP, FakeCore, pod_event, prog_unloaded, tc_state

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


@pytest.fixture
def two_pods(tmp_path):
    """ps-0 and worker-0 as pods: a namespace each, joined by a veth (eth0 both
    sides), a sleeping 'pause' process in a cgroup named after each pod's UID."""
    link = udp_link.build_link("kspod")
    pods, procs, groups = {}, [], []
    try:
        for replica, ns in (("ps-0", link.sender), ("worker-0", link.receiver)):
            uid = str(uuid.uuid4())
            proc = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "300"])
            procs.append(proc)
            for _ in range(100):
                if os.readlink(f"/proc/{proc.pid}/ns/net") != os.readlink("/proc/self/ns/net"):
                    break
                time.sleep(0.02)
            group = CGROUP / f"ks-e2e-pod{uid}"
            group.mkdir()
            groups.append(group)
            (group / "cgroup.procs").write_text(str(proc.pid))
            pods[replica] = SimpleNamespace(uid=uid, pid=proc.pid, netns=ns)
        yield link, pods
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        for group in groups:
            group.rmdir()
        udp_link.remove_link(link)


def run_role(ns, replica, mount, hosts, results):
    """The pod's container: the entrypoint with the config map mounted, the PS's
    service name resolvable (a private /etc/hosts inside `ip netns exec`'s own
    mount namespace), as in a pod."""
    script = (f"mount --bind {hosts} /etc/hosts && exec {sys.executable} "
              f"{REPO / 'workers' / 'entrypoint.py'} --spec {mount / resources.SPEC_KEY} "
              f"--replica {replica}")
    env = {**os.environ, "TAILCUT_RESULTS_DIR": str(results), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO)}
    return subprocess.Popen(["ip", "netns", "exec", ns, "sh", "-c", script], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_pods_tag_their_tensors_and_the_agents_classifier_sorts_them(two_pods, tmp_path):
    link, pods = two_pods
    job = spec.load_text(JOB)
    data = resources.config_map(job, OWNER)["data"]   # what the operator stores
    mount = tmp_path / "etc-tailcut"
    mount.mkdir()
    for key, text in data.items():
        (mount / key).write_text(text)
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{udp_link.SENDER_IP} ps-0.ks-pods\n")

    node_agent = agent.Agent(FakeCore(data[resources.SPEC_KEY]), node="ks-node")
    try:
        for replica, pod in pods.items():
            node_agent.handle("ADDED", pod_event(pod.uid, "Running"))
        ps_shaped = node_agent.shaped[pods["ps-0"].uid]
        worker_shaped = node_agent.shaped[pods["worker-0"].uid]
        prog_ids = {tc_state(p.pid)[2][0][1] for p in pods.values()}

        results = tmp_path / "results"
        results.mkdir()
        roles = [run_role(pods[r].netns, r, mount, hosts, results)
                 for r in ("ps-0", "worker-0")]
        outputs = [p.communicate(timeout=120)[0] for p in roles]
        assert [p.returncode for p in roles] in ([0, 0], [0, 1], [1, 1]), outputs
        # (1 = finished without reaching a target accuracy; this job sets none)

        ps_bytes = {lvl: b for lvl, (_, b) in ps_shaped.enforcement.counts().popitem()[1].items()}
        w_bytes = {lvl: b for lvl, (_, b) in
                   worker_shaped.enforcement.counts().popitem()[1].items()}
    finally:
        for pod in pods.values():
            node_agent.handle("DELETED", pod_event(pod.uid, "Succeeded"))

    levels = flowreport.role_flows(job)
    fc3 = levels["pull"]["fc3.weight"]
    # PARAMS go out of the PS's eth0 one tagged part per tensor: every level is seen,
    # and fc3.weight (83% of the model) puts most bytes at its level.
    assert all(ps_bytes[lvl] > 0 for lvl in range(4)), ps_bytes
    assert ps_bytes[fc3] > 0.5 * sum(ps_bytes.values()), ps_bytes
    # PUSHes leave the worker's eth0 tagged the same way.
    assert w_bytes[levels["push"]["fc3.weight"]] > 0.5 * sum(w_bytes.values()), w_bytes
    with (results / "flows-worker-0.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["layer"]: int(r["level"]) for r in rows} == levels["pull"]

    for pod in pods.values():
        assert tc_state(pod.pid) == BARE, "the agent left a qdisc or filter behind"
    assert all(prog_unloaded(i) for i in prog_ids)
