"""The node agent finds a pod's process by its UID in /proc/<pid>/cgroup, names its
network namespace and shapes the pod's eth0 with tailcut.net.shaping, as the local
runtime does; it lets go when the pod goes and leaves the pod itself running."""

import json
import os
import re
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
from tests import waiting

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


# --- spec.scheduling: cadentflow priority classes and classifier on the pod's eth0 ---

def job_yaml(name, scheduling, **extra):
    job = spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                          "metadata": {"name": name},
                          "spec": {"network": {"accessLink": {"bandwidth": "100Mbit"}},
                                   "training": {"model": "deep-mlp"},
                                   "scheduling": scheduling, **extra}})
    return yaml.safe_dump(job.model_dump(by_alias=True, mode="json"))


@pytest.fixture
def pod_on_link():
    """A pod whose eth0 is one end of a veth to another namespace (the node side),
    with addresses, so that traffic really leaves through the pod's egress: a process
    in the pod's namespace, in a cgroup named after the pod's UID."""
    from tests.datapath import udp_link

    uid = str(uuid.uuid4())
    link = udp_link.build_link("ks")
    proc = subprocess.Popen(["ip", "netns", "exec", link.sender, "sleep", "120"])
    group = CGROUP / f"ks-test-pod{uid}"
    try:
        for _ in range(100):   # until `ip netns exec` has entered the namespace
            if os.readlink(f"/proc/{proc.pid}/ns/net") != os.readlink("/proc/self/ns/net"):
                break
            time.sleep(0.02)
        group.mkdir()
        (group / "cgroup.procs").write_text(str(proc.pid))
        assert tc_state(proc.pid) == BARE
        agents = []
        yield SimpleNamespace(uid=uid, pid=proc.pid, proc=proc, link=link, agents=agents,
                              agent=lambda job: agents.append(agent.Agent(
                                  FakeCore(job), node="ks-node")) or agents[-1])
    finally:
        for a in agents:   # a test that failed half-way leaves nothing attached
            a.release_all()
        agent.detach(agent.netns_name(uid))
        proc.kill()
        proc.wait()
        if group.exists():
            group.rmdir()
        udp_link.remove_link(link)


def tc_state(pid):
    """The pod's eth0 egress as tc sees it: qdisc kinds, HTB class ids (1:xx) with
    their bytes sent, and the BPF filters' (name, program id)."""
    with IPRoute(netns=f"/proc/{pid}/ns/net") as ipr:
        index = ipr.link_lookup(ifname="eth0")[0]
        kinds = sorted(q.get_attr("TCA_KIND") for q in ipr.get_qdiscs(index))
        classes = {f"1:{c['handle'] & 0xFFFF:x}":
                   c.get_attr("TCA_STATS2").get_attr("TCA_STATS_BASIC")["bytes"]
                   for c in ipr.get_classes(index=index)}
    shown = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "tc", "-j", "filter",
                            "show", "dev", "eth0", "egress"],
                           capture_output=True, text=True).stdout
    filters = [(f["options"]["bpf_name"], f["options"]["prog"]["id"])
               for f in json.loads(shown or "[]") if "options" in f]
    return kinds, classes, filters


BARE = (["noqueue"], {}, [])   # a veth as the CNI leaves it: no qdisc, no filter


def prog_loaded(prog_id):
    return subprocess.run(["bpftool", "prog", "show", "id", str(prog_id)],
                          capture_output=True).returncode == 0


def prog_unloaded(prog_id):
    """True once program `prog_id` is gone. Deleting the last tc filter that holds a
    program frees it after an RCU grace period, so its id can outlive the delete."""
    return waiting.until(lambda: not prog_loaded(prog_id))


def send_tagged_udp(link, level, count):
    """`count` datagrams from the pod to the node side with the DSCP of `level`."""
    import socket

    from tailcut.datapath import classifier
    from tests.datapath import udp_link

    with netns.entered(link.sender):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, classifier.tos_of(level))
        for _ in range(count):
            s.sendto(b"x" * 200, (udp_link.RECEIVER_IP, 9))
    finally:
        s.close()


@pytest.mark.netns
@pytest.mark.bpf
def test_agent_puts_cadentflow_classes_and_classifier_on_the_pod_and_removes_them(pod_on_link):
    node_agent = pod_on_link.agent(job_yaml("ks-cf", {"policy": "cadentflow",
                                                      "priorityLevels": 3}))
    node_agent.handle("MODIFIED", pod_event(pod_on_link.uid, "Running"))
    kinds, classes, filters = tc_state(pod_on_link.pid)
    assert sorted(classes) == ["1:1", "1:10", "1:20", "1:21", "1:22"]
    assert "clsact" in kinds and "htb" in kinds
    [(prog_name, prog_id)] = filters
    assert prog_name.startswith("tailcut_classify") and prog_loaded(prog_id)
    shaped = node_agent.shaped[pod_on_link.uid]
    assert "cadentflow" in shaped.description and "1:22 prio 2" in shaped.description

    send_tagged_udp(pod_on_link.link, level=1, count=200)
    counts = shaped.enforcement.counts()
    [by_level] = counts.values()
    assert by_level[1][0] >= 200 and by_level[0][0] == 0 and by_level[2][0] == 0
    _, after, _ = tc_state(pod_on_link.pid)
    assert after["1:21"] - classes["1:21"] >= 200 * 200, "tagged packets went to 1:21"
    assert after["1:20"] == classes["1:20"] and after["1:22"] == classes["1:22"]

    node_agent.handle("MODIFIED", pod_event(pod_on_link.uid, "Succeeded"))
    assert not node_agent.shaped and not netns.exists(agent.netns_name(pod_on_link.uid))
    assert tc_state(pod_on_link.pid) == BARE, "no qdisc, class or filter of ours left"
    assert re.search(r"level 1 2\d\d\b", agent.classified(shaped)), agent.classified(shaped)
    assert prog_unloaded(prog_id), "the classifier program is unloaded"
    assert pod_on_link.proc.poll() is None, "releasing must not end the pod"


@pytest.mark.netns
def test_agent_adds_no_classes_for_fair_and_removes_its_shaping_when_the_pod_goes(pod_on_link):
    node_agent = pod_on_link.agent(job_yaml("ks-fair", {"policy": "fair"}))
    node_agent.handle("ADDED", pod_event(pod_on_link.uid, "Running"))
    kinds, classes, filters = tc_state(pod_on_link.pid)
    assert sorted(classes) == ["1:1", "1:10"] and filters == [] and kinds == ["htb"]
    assert "fair" not in node_agent.shaped[pod_on_link.uid].description
    node_agent.handle("DELETED", pod_event(pod_on_link.uid, "Running"))
    assert tc_state(pod_on_link.pid) == BARE


@pytest.mark.netns
@pytest.mark.bpf
def test_agent_stopping_releases_every_pod(pod_on_link):
    node_agent = pod_on_link.agent(job_yaml("ks-stop", {"policy": "cadentflow"}))
    node_agent.handle("ADDED", pod_event(pod_on_link.uid, "Running"))
    [(_, prog_id)] = tc_state(pod_on_link.pid)[2]
    node_agent.release_all()
    assert not node_agent.shaped and tc_state(pod_on_link.pid) == BARE
    assert prog_unloaded(prog_id)


@pytest.mark.netns
@pytest.mark.bpf
def test_agent_clears_a_classifier_left_by_a_killed_agent_before_enforcing_again(pod_on_link):
    from tailcut.datapath import classifier

    # What a SIGKILLed agent leaves: the filter on the pod's eth0, nobody to detach it.
    stale = classifier.attach(pod_on_link.link.sender, "eth0")
    try:
        node_agent = pod_on_link.agent(job_yaml("ks-stale", {"policy": "cadentflow"}))
        node_agent.handle("ADDED", pod_event(pod_on_link.uid, "Running"))
        [(prog_name, _)] = tc_state(pod_on_link.pid)[2]
        assert prog_name.startswith("tailcut_classify")
        node_agent.handle("DELETED", pod_event(pod_on_link.uid, "Running"))
        assert tc_state(pod_on_link.pid) == BARE
    finally:
        stale.detach()   # only frees its counter slot: the filter is gone already


def test_agent_refuses_a_policy_it_cannot_enforce_naming_the_field():
    node_agent = agent.Agent(FakeCore(job_yaml("ks-appdrop", {"policy": "cadentflow"},
                                               transport={"type": "app-drop", "p": 0.9})),
                             node="ks-node")
    with pytest.raises(agent.AgentError, match=r"spec.scheduling.policy='cadentflow' with "
                                               r"spec.transport.type='app-drop'"):
        node_agent.handle("ADDED", pod_event(str(uuid.uuid4()), "Running"))
    assert not node_agent.shaped
