"""The node agent finds a pod's process by its UID in /proc/<pid>/cgroup, names its
network namespace and shapes the pod's eth0 with tailcut.net.shaping, as the local
runtime does; it lets go when the pod goes and leaves the pod itself running."""

import os
import subprocess
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from pyroute2 import IPRoute

from tailcut import spec
from tailcut.k8s import agent, resources
from tailcut.net import netns

CGROUP = Path("/sys/fs/cgroup/pids")


def test_pid_of_pod_matches_cgroupfs_and_systemd_spellings_of_the_uid(tmp_path):
    uid = "0d1c2b3a-1111-2222-3333-444455556666"
    for pid, line in ((11, "8:pids:/kubepods/burstable/pod" + uid + "/abc"),
                      (12, "0::/kubepods.slice/kubepods-pod" + uid.replace("-", "_") + ".slice")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(line + "\n")
    (tmp_path / "self").mkdir()
    assert agent.pid_of_pod(uid, tmp_path) in (11, 12)
    assert agent.pid_of_pod("ffffffff-0000-0000-0000-000000000000", tmp_path) is None


def test_netns_names_fit_and_stay_out_of_tailcut_clean():
    name = agent.netns_name(str(uuid.uuid4()))
    assert name.startswith("tck8s-") and not name.startswith("tailcut-")


@pytest.fixture
def fake_pod():
    """A process in its own network namespace with an eth0 (as a CNI would leave it),
    in a cgroup named after a pod UID (as the kubelet would put it)."""
    uid = str(uuid.uuid4())
    proc = subprocess.Popen(["unshare", "--net", "sleep", "120"])
    group = CGROUP / f"k8-test-pod{uid}"
    try:
        for _ in range(100):   # wait until unshare has exec'd sleep in the new netns
            if os.readlink(f"/proc/{proc.pid}/ns/net") != os.readlink("/proc/self/ns/net"):
                break
            time.sleep(0.02)
        group.mkdir()
        (group / "cgroup.procs").write_text(str(proc.pid))
        with IPRoute(netns=f"/proc/{proc.pid}/ns/net") as ipr:
            ipr.link("add", ifname="eth0", kind="veth", peer="k8peer")
            for ifname in ("eth0", "k8peer"):
                ipr.link("set", index=ipr.link_lookup(ifname=ifname)[0], state="up")
        yield SimpleNamespace(uid=uid, pid=proc.pid, proc=proc)
    finally:
        agent.detach(agent.netns_name(uid))   # in case the test failed half-way
        proc.kill()
        proc.wait()
        if group.exists():
            group.rmdir()


class FakeCore:
    """The one API call the agent makes, answered with a job's spec config map."""

    def __init__(self, job_yaml):
        self.job_yaml = job_yaml

    def read_namespaced_config_map(self, name, namespace):
        return SimpleNamespace(data={resources.SPEC_KEY: self.job_yaml})


def pod_event(uid, phase):
    return SimpleNamespace(
        metadata=SimpleNamespace(uid=uid, namespace="k8-lab", name="k8-demo-worker-0",
                                 annotations={resources.ANNOTATION_SPEC_MAP: "k8-demo-spec"}),
        spec=SimpleNamespace(host_network=False), status=SimpleNamespace(phase=phase))


def htb_rates(pid):
    with IPRoute(netns=f"/proc/{pid}/ns/net") as ipr:
        index = ipr.link_lookup(ifname="eth0")[0]
        return sorted(c.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_PARMS")["rate"]
                      for c in ipr.get_classes(index=index))


@pytest.mark.netns
def test_agent_shapes_a_running_pod_and_releases_it_when_the_pod_goes(fake_pod):
    job = spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                          "metadata": {"name": "k8-demo"},
                          "spec": {"network": {"accessLink": {"bandwidth": "100Mbit"}}}})
    job_yaml = yaml.safe_dump(job.model_dump(by_alias=True, mode="json"))
    node_agent = agent.Agent(FakeCore(job_yaml), node="k8-node")
    node_agent.handle("MODIFIED", pod_event(fake_pod.uid, "Pending"))
    assert not node_agent.shaped, "a pod that is not running yet has no process to enter"
    node_agent.handle("MODIFIED", pod_event(fake_pod.uid, "Running"))
    name = agent.netns_name(fake_pod.uid)
    assert netns.exists(name)
    assert htb_rates(fake_pod.pid) == [100 * 10**6 // 8] * 2   # bytes/s in both HTB classes
    assert "htb 100 Mbit/s" in node_agent.shaped[fake_pod.uid].description
    node_agent.handle("MODIFIED", pod_event(fake_pod.uid, "Running"))   # no second time
    node_agent.handle("DELETED", pod_event(fake_pod.uid, "Running"))
    assert not netns.exists(name) and not node_agent.shaped
    assert fake_pod.proc.poll() is None, "releasing the name must not end the pod"


@pytest.mark.netns
def test_agent_refuses_host_network_pods_unless_told_otherwise(fake_pod):
    node_agent = agent.Agent(FakeCore(""), node="k8-node")
    event = pod_event(fake_pod.uid, "Running")
    event.spec.host_network = True
    node_agent.handle("ADDED", event)
    assert not node_agent.shaped
