"""An agent that dies leaves its jobs' fabrics with the holder; the next one adopts
them as they are (no link rebuilt, traffic flows), rebuilds what was built for another
incarnation of the job, and removes what no pod claims: real namespaces, veths and HTB,
a real holder process, pods faked as in test_agent.py."""

import os
import signal
import subprocess
import sys

import pytest

from tailcut.k8s.agent import holder
from tailcut.net import netns, topology
from tests import netutil, waiting
from tests.k8s import fakepod
from tests.k8s.test_agent import fabric_namespaces, job, make_agent, pod_event

JOB = "k8-keep"
SPEC = {"replicas": {"workers": 1}, "network": {"accessLink": {"bandwidth": "100Mbit"}}}


@pytest.fixture
def pods():
    with fakepod.Maker() as make:
        yield make


@pytest.fixture
def holder_path(tmp_path):
    path = str(tmp_path / "holder.sock")
    proc = subprocess.Popen([sys.executable, "-m", "tailcut.k8s.agent.holder", path])
    assert waiting.until(lambda: os.path.exists(path), within_s=10)
    yield path
    proc.kill()
    proc.wait()
    for name in fabric_namespaces(JOB):   # whatever a failed test left
        netns.remove(name)


def agent_with(path, j=None):
    made = make_agent(job(JOB, **SPEC) if j is None else j)
    made.keeper = holder.Client(path)
    return made


def die(agent):
    """The agent is killed: the names it gave (mounts inside its mount namespace) go,
    their files stay (its /run/netns is a volume of its pod), nothing is undone; the
    holder's open files keep the fabric's namespaces alive."""
    for name in fabric_namespaces(JOB) + [w.name for w in agent.wired.values()]:
        netns.remove(name)
        open(netns.path(name), "w").close()
    agent.keeper.close()


def link_indexes(names):
    out = {}
    for ns in names:
        with netns.ipr(ns) as ipr:
            out[ns] = sorted((link.get_attr("IFLA_IFNAME"), link["index"])
                             for link in ipr.get_links())
    return out


def pod_link_index(pod):
    """The ifindex of the pod's tc0 (in its namespace): a link made again has another."""
    out = subprocess.run(["nsenter", f"--net=/proc/{pod.pid}/ns/net", "ip", "-o", "link",
                          "show", "tc0"], capture_output=True, text=True, check=True)
    return int(out.stdout.split(":")[0])


@pytest.mark.netns
def test_a_new_agent_adopts_the_fabric_and_links_the_holder_kept(pods, holder_path):
    first = agent_with(holder_path)
    ps, worker = pods("ps-0"), pods("worker-0")
    for pod in (ps, worker):
        first.handle("ADDED", pod_event(pod, "Running", JOB))
    names = fabric_namespaces(JOB)
    inodes = {n: os.stat(netns.path(n)).st_ino for n in names}
    links, tc0 = link_indexes(names), [pod_link_index(p) for p in (ps, worker)]
    described = {w.replica: w.description for w in first.wired.values()}
    die(first)

    second = agent_with(holder_path)
    try:
        second.take_over()
        assert {n: os.stat(netns.path(n)).st_ino for n in names} == inodes
        for pod in (ps, worker):   # as the API server has them: with what first recorded
            second.handle("ADDED", annotated(pod_event(pod, "Running", JOB),
                                             first.core.annotations[f"{JOB}-{pod.replica}"]))
        [fabric] = second.fabrics.values()
        assert fabric.adopted
        assert link_indexes(names) == links, "a link of the fabric was rebuilt"
        assert [pod_link_index(p) for p in (ps, worker)] == tc0, "a pod was wired anew"
        assert {w.replica: w.description for w in second.wired.values()} == described
        ip = topology.plan(job(JOB, **SPEC)).pod("ps-0").ip
        assert netutil.udp_delivered(worker.name, ps.name, ip, 100) == 100
    finally:
        second.release_all()
    assert fabric_namespaces(JOB) == [] and second.keeper.held() == {}


@pytest.mark.netns
def test_a_fabric_built_for_another_incarnation_of_the_job_is_built_anew(pods, holder_path):
    first = agent_with(holder_path)
    ps = pods("ps-0")
    first.handle("ADDED", pod_event(ps, "Running", JOB))
    inodes = {n: os.stat(netns.path(n)).st_ino for n in fabric_namespaces(JOB)}
    die(first)

    second = agent_with(holder_path)
    new_uid = "7e57a9e1-0000-4000-8000-0000000new01"
    second.jobs.training_job["metadata"]["uid"] = new_uid
    try:
        second.take_over()
        second.handle("ADDED", pod_event(ps, "Running", JOB, uid=new_uid))
        [fabric] = second.fabrics.values()
        assert not fabric.adopted
        assert all(os.stat(netns.path(n)).st_ino != inodes[n] for n in inodes)
    finally:
        second.release_all()
    assert second.keeper.held() == {}


@pytest.mark.netns
def test_a_fabric_no_pod_claims_after_the_restart_is_removed(pods, holder_path):
    first = agent_with(holder_path)
    first.handle("ADDED", pod_event(pods("ps-0"), "Running", JOB))
    die(first)

    second = agent_with(holder_path)
    second.take_over()
    assert len(fabric_namespaces(JOB)) == 2
    second._remove_unclaimed(present=[])   # the first listing found none of the job's pods
    assert fabric_namespaces(JOB) == [] and second.keeper.held() == {}


@pytest.mark.netns
def test_a_pod_its_agent_died_wiring_is_wired_anew_not_adopted(pods, holder_path):
    """The annotation goes on a pod once it is wired whole: a pod without it (the agent
    died half-way through wiring it) gets its access link made again."""
    first = agent_with(holder_path)
    ps, worker = pods("ps-0"), pods("worker-0")
    for pod in (ps, worker):
        first.handle("ADDED", pod_event(pod, "Running", JOB))
    before = [pod_link_index(p) for p in (ps, worker)]
    die(first)

    second = agent_with(holder_path)
    try:
        second.take_over()
        recorded = first.core.annotations[f"{JOB}-ps-0"]
        second.handle("ADDED", annotated(pod_event(ps, "Running", JOB), recorded))
        second.handle("ADDED", pod_event(worker, "Running", JOB))   # never recorded
        assert second.wired[ps.uid].adopted and not second.wired[worker.uid].adopted
        assert pod_link_index(ps) == before[0] and pod_link_index(worker) != before[1]
        assert list(second.core.annotations) == [f"{JOB}-worker-0"], \
            "an adopted pod's annotation is the agent's that wired it"
        ip = topology.plan(job(JOB, **SPEC)).pod("ps-0").ip
        assert netutil.udp_delivered(worker.name, ps.name, ip, 100) == 100
    finally:
        second.release_all()


def annotated(event, annotations):
    event.metadata.annotations = annotations
    return event


@pytest.mark.netns
def test_the_agent_leaves_its_fabrics_only_while_its_holder_keeps_them(pods, holder_path,
                                                                       tmp_path):
    """SIGTERM to the agent alone (its container restarts): the holder is not stopping,
    the fabrics stay. The pod going (the holder stopping too) or no holder: removed."""
    agent = agent_with(holder_path)
    agent.handle("ADDED", pod_event(pods("ps-0"), "Running", JOB))
    try:
        assert agent.leaves_fabrics(wait_s=0.3)
        assert sorted(agent.keeper.held()) == fabric_namespaces(JOB), "not all held"
        nowhere = agent_with(str(tmp_path / "none.sock"))
        assert not nowhere.leaves_fabrics(wait_s=0.3)
        holders = [p for p in psutil_children() if "tailcut.k8s.agent.holder" in p[1]]
        os.kill(holders[-1][0], signal.SIGTERM)
        assert not agent.leaves_fabrics(wait_s=3)
    finally:
        agent.release_all()
    assert fabric_namespaces(JOB) == []


def psutil_children():
    """(pid, command line) of this process's children."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
                cmd = open(f"/proc/{entry}/cmdline").read().replace("\0", " ")
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
                out.append((int(entry), cmd))
    return out


@pytest.mark.netns
def test_a_holder_that_restarted_alone_is_handed_every_fabric_again(pods, holder_path):
    agent = agent_with(holder_path)
    agent.handle("ADDED", pod_event(pods("ps-0"), "Running", JOB))
    try:
        [(pid, _)] = [p for p in psutil_children() if "tailcut.k8s.agent.holder" in p[1]]
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.unlink(holder_path)
        again = subprocess.Popen([sys.executable, "-m", "tailcut.k8s.agent.holder",
                                  holder_path])
        try:
            assert waiting.until(lambda: os.path.exists(holder_path), within_s=10)
            assert agent.keeper.held() == {}
            assert agent.hold_all()   # as the agent does at each listing of its pods
            assert sorted(agent.keeper.held()) == fabric_namespaces(JOB)
        finally:
            again.kill()
            again.wait()
    finally:
        agent.release_all()
