"""The local cluster itself: pods run on the node with DNS and Services working, the
garbage collector removes owned children, a failed bring-up names the component, and
`down` leaves nothing behind."""

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tailcut.k8s.node import configs, images, imagestore
from tailcut.k8s.node.cluster import Cluster
from tailcut.k8s.node.layout import Node
from tailcut.k8s.node.procs import ClusterError
from tailcut.net import netns
from tests.cluster import chart
from tests.waiting import until

PROBE = """
import socket
import tailcut.transports.wire as wire
print("header", wire.HEADER_FILE.exists())
print("dns", socket.gethostbyname("h0.probe.{ns}.svc.cluster.local"))
with socket.create_connection(("kubernetes.default.svc.cluster.local", 443), timeout=5):
    print("service ok")
"""


def test_a_pod_from_the_worker_image_resolves_a_headless_service_and_reaches_the_api(
        cluster, release, namespace):
    """The worker image imports tailcut's wire format (its BPF header is package
    data); the pod finds itself through the headless service's DNS name, and reaches
    the API server through the `kubernetes` Service (kube-proxy's translation)."""
    manifests = [
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "probe"},
         "spec": {"clusterIP": "None", "selector": {"app": "probe"},
                  "publishNotReadyAddresses": True, "ports": [{"port": 80}]}},
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "probe", "labels": {"app": "probe"}},
         "spec": {"hostname": "h0", "subdomain": "probe", "restartPolicy": "Never",
                  "containers": [{"name": "probe", "image": images.ref("worker"),
                                  "imagePullPolicy": "Never", "command": ["python", "-c"],
                                  "args": [PROBE.format(ns=namespace)]}]}},
    ]
    cluster.kubectl("-n", namespace, "apply", "-f", "-",
                    input=yaml.safe_dump_all(manifests))
    assert until(lambda: (chart.get(cluster, namespace, "pod", "probe") or {}).get(
        "status", {}).get("phase") in ("Succeeded", "Failed"), within_s=120, every_s=1)
    log = cluster.kubectl("-n", namespace, "logs", "probe").stdout
    pod = chart.get(cluster, namespace, "pod", "probe")
    assert pod["status"]["phase"] == "Succeeded", log
    assert "header True" in log
    assert "dns 10.244." in log
    assert "service ok" in log


def test_an_archive_a_node_already_holds_is_not_imported_again(cluster, release):
    """Each node's image store outlives clusters: the archives the session loaded are
    known by their identity, so loading them again (what a warm `tailcut cluster up`
    does) asks containerd once instead of importing about 1.5 GB."""
    archives = list(images.build_all(progress=lambda line: None).values())
    said: list[str] = []
    started = time.monotonic()
    for node in cluster.nodes:
        assert {imagestore.archive_id(a) for a in archives} <= imagestore.loaded_archives(node)
        imagestore.load(node, archives, said.append)
    assert time.monotonic() - started < 5.0, said
    assert len(said) == len(archives) * len(cluster.nodes)
    assert all("already loaded" in line for line in said), said


def test_deleting_a_deployment_lets_the_garbage_collector_remove_its_pods(cluster, namespace):
    cluster.kubectl("-n", namespace, "create", "deployment", "paused",
                    f"--image={configs.PAUSE_IMAGE}", "--replicas=2")
    assert until(lambda: len([p for p in chart.get(cluster, namespace, "pods")["items"]
                              if p["status"].get("phase") == "Running"]) == 2,
                 within_s=90, every_s=1)
    cluster.kubectl("-n", namespace, "delete", "deployment", "paused")
    assert until(lambda: not chart.get(cluster, namespace, "pods")["items"], within_s=90,
                 every_s=1)


def leftovers(node: Node) -> list[str]:
    """Everything of `node` still on the host."""
    found = []
    if netns.exists(node.name):
        found.append(f"netns {node.name}")
    links = subprocess.run(["ip", "-j", "link"], capture_output=True, text=True).stdout
    found += [f"link {link['ifname']}" for link in json.loads(links)
              if link["ifname"] == node.host_veth]
    for pid_dir in Path("/proc").iterdir():
        if pid_dir.name.isdigit():
            try:
                cmd = (pid_dir / "cmdline").read_bytes().decode(errors="replace")
                cgroup = (pid_dir / "cgroup").read_text()
            except OSError:
                continue
            if str(node.dir) in cmd or f"/{node.name}/" in cgroup:
                found.append(f"process {pid_dir.name}: {cmd[:80]!r}")
    mounts = Path("/proc/self/mountinfo").read_text()
    found += [f"mount {line.split()[4]}" for line in mounts.splitlines()
              if str(node.workdir) in line.split()[4]]
    found += [f"cgroup {p}" for p in Path("/sys/fs/cgroup").glob(f"*/{node.name}")]
    found += [f"directory {d}" for d in (node.workdir, node.run_dir) if d.exists()]
    return found


def test_up_then_down_leaves_nothing_behind(short_workdir):
    """A second cluster of two nodes beside the session's (nodes 3 and 4: their own
    names and addresses) runs a pod on its second node; `down` then removes every
    process, mount, namespace, link, cgroup and file it had, and its LAN (and, asked
    to, the nodes' image stores, which otherwise stay for the next cluster)."""
    workdir = short_workdir / "second"
    second = Cluster.up(workdir, progress=lambda line: None, index=3, nodes=2)
    try:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "paused"},
               "spec": {"nodeName": "tcnode-4", "containers": [{
                   "name": "p", "image": configs.PAUSE_IMAGE, "imagePullPolicy": "Never"}]}}
        second.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))
        assert until(lambda: (chart.get(second, "default", "pod", "paused") or {}).get(
            "status", {}).get("phase") == "Running", within_s=90, every_s=1)
        assert netns.list_names("cni-"), "the pod has no network namespace"
        assert netns.exists("tcnode-lan-3")
    finally:
        Cluster.down(workdir, progress=lambda line: None, purge_images=True)
    assert leftovers(second.nodes[0]) == [] and leftovers(second.nodes[1]) == []
    assert not any(imagestore.root(n).exists() for n in second.nodes), "image store kept"
    assert not netns.exists("tcnode-lan-3")


def test_a_component_that_fails_is_named_with_the_end_of_its_log(short_workdir, monkeypatch):
    monkeypatch.setattr(configs, "corefile", lambda node, kubeconfig: "this is not a Corefile {\n")
    workdir = short_workdir / "broken"
    with pytest.raises(ClusterError) as err:
        Cluster.up(workdir, progress=lambda line: None, index=5)
    message = str(err.value)
    assert message.startswith("coredns exited during start-up")
    assert "coredns.log" in message and "Corefile" in message
    assert leftovers(Node(5, workdir)) == []


def test_a_cluster_whose_node_names_are_taken_is_refused_and_the_other_left_alone(
        short_workdir):
    """Node names (tcnode-<i>) are global on the host: a second cluster asked to use
    another's numbers must refuse before it creates (or, failing, removes) anything."""
    netns.create("tcnode-9")
    try:
        with pytest.raises(ClusterError, match=r"node name tcnode-9 is taken"):
            Cluster.up(short_workdir / "taken", progress=lambda line: None, index=8, nodes=2)
        assert netns.exists("tcnode-9") and not netns.exists("tcnode-8")
    finally:
        netns.remove("tcnode-9")
