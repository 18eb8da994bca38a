"""An agent that dies leaves its jobs' fabrics with the holder; the next one adopts
them as they are (no link rebuilt, traffic flows), rebuilds what was built for another
incarnation of the job, and removes what no pod claims: real namespaces, veths and HTB,
a real holder process, pods faked as in test_agent.py."""

import os
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
    out = subprocess.run(["nsenter", f"--net=/proc/{pod.pid}/ns/net", "cat",
                          "/sys/class/net/tc0/ifindex"], capture_output=True, text=True)
    return out.stdout.strip()


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
        for pod in (ps, worker):
            second.handle("ADDED", pod_event(pod, "Running", JOB))
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
