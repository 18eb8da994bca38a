"""The tests marked `cluster` run on a real Kubernetes cluster of two nodes and a kind-like
third (tailcut.k8s.node.cluster: etcd, the control plane, containerd + runc, the
kubelet, kube-proxy and CoreDNS; the second node its own network namespace with its own
containerd, kubelet and kube-proxy), brought up once for this package and taken down after its
last test, with tailcut's images built from their Dockerfiles and the chart installed with
helm. A job's racks are spread over both nodes (tailcut.k8s.manifests.placement), so every
multi-rack example runs across nodes, its spines joined by VXLAN. A third node,
tcnode-2, looks like a kind node as kind's defaults make it (LAN MTU 1500, no kernel
headers: tailcut.k8s.node.layout); it is cordoned, so jobs are placed on the other two
(the agent's DaemonSet runs there all the same), except in test_kind_node.py."""

import itertools
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from tailcut.k8s.node import images
from tailcut.k8s.node.cluster import Cluster
from tests.cluster import chart

_counter = itertools.count()
NODES = 3   # tcnode-0 to -2; other tests' clusters use node numbers from 3
KIND_LIKE = 1   # the last: tcnode-2
KIND_NODE = "tcnode-2"
CHART = Path(__file__).resolve().parents[2] / "helm" / "tailcut"


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)


# Package scope: the cluster's daemons (apiserver, etcd, kubelets) stop when the last
# cluster test ends, so the tests after them do not share the cores with them.
@pytest.fixture(scope="package")
def cluster(tmp_path_factory, k8s_tools):
    if os.geteuid() != 0:
        pytest.skip("the cluster tests need root (namespaces, containerd, the kubelet)")
    workdir = tmp_path_factory.mktemp("cluster")
    up = Cluster.up(workdir, progress=lambda line: None, nodes=NODES, kind_like=KIND_LIKE)
    try:
        up.kubectl("cordon", KIND_NODE)
        yield up
    finally:
        Cluster.down(workdir, progress=lambda line: None)


@pytest.fixture(scope="package")
def release(cluster):
    """tailcut's images, the worker with PyTorch too (cached until their sources
    change), loaded into the nodes, as `kind load docker-image` would, and the chart
    installed with helm, naming the torch image."""
    archives = images.build_all(progress=lambda line: None, torch=True)
    torch = archives.pop("worker-torch")
    cluster.load_images(list(archives.values()))
    # (no torch job goes to the kind-like node: 650 MiB it need not import)
    cluster.load_images([torch], [n for n in cluster.nodes if not n.kind_like])
    # As docs/kubernetes.md says: the namespace first, labelled for the agent's Pod
    # Security level (helm cannot label the namespace it installs into).
    cluster.kubectl("create", "namespace", chart.RELEASE_NS)
    cluster.kubectl("label", "namespace", chart.RELEASE_NS,
                    "pod-security.kubernetes.io/enforce=privileged")
    # The nodes share this host, each with its own containerd state: the agents see
    # tcnode-0's records (they find its pods' processes from the runtime) and no other
    # node's (theirs by cgroup), so both ways run.
    chart.helm(cluster, "install", chart.RELEASE, str(CHART), "--namespace",
               chart.RELEASE_NS, "--set", "workers.torchImage=worker-torch",
               *chart.runtime_state_values(cluster),
               "--wait", "--timeout", "3m")
    return chart.RELEASE_NS


@pytest.fixture
def namespace(cluster):
    name = f"cl-{next(_counter)}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def short_workdir():
    """A work dir for a second cluster: pytest's tmp_path for a long test name would
    push the kubelet's sockets past the kernel's 107-byte limit."""
    path = Path(tempfile.mkdtemp(prefix="tc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
