"""A real etcd + kube-apiserver for the tests marked `k8s`, started once per session
on loopback (tailcut.k8s.node.devcluster), with the TrainingJob CRD installed."""

import itertools
import subprocess
import uuid
from pathlib import Path

import pytest

from tailcut.k8s.manifests import crd
from tailcut.k8s.node import devcluster

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "tailcut"
RELEASE_NS = "k8-tailcut-system"
_counter = itertools.count()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory, k8s_tools):
    cp = devcluster.ControlPlane.start(tmp_path_factory.mktemp("k8s-control-plane"))
    try:
        cp.kubectl("apply", "--server-side", "-f", str(REPO / "manifests" / "crd.yaml"))
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                   f"crd/{crd.CRD_NAME}")
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def namespace(control_plane):
    """A fresh namespace (with its default service account, which pods need and no
    controller-manager creates here). Nothing deletes namespaces here: without a
    controller-manager they would stay Terminating, and the store is thrown away."""
    name = f"k8-{next(_counter)}-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", name)
    control_plane.kubectl("-n", name, "create", "serviceaccount", "default")
    return name


def helm(cp, *args, check=True):
    return subprocess.run([str(devcluster.helm_binary()), "--kubeconfig", str(cp.kubeconfig),
                           *args], capture_output=True, text=True, check=check, timeout=120)


@pytest.fixture(scope="session")
def release(control_plane):
    """The chart installed with helm (CRDs, operator, agent, RBAC) in RELEASE_NS."""
    helm(control_plane, "install", "tailcut", str(CHART), "--namespace", RELEASE_NS,
         "--create-namespace")
    return RELEASE_NS


def operator_kubeconfig(cp, release, name):
    """A kubeconfig carrying a token of the chart's operator service account."""
    token = cp.kubectl("-n", release, "create", "token", "tailcut-operator",
                       "--duration=2h").stdout.strip()
    return cp.user_kubeconfig(name, token)


def agent_clients(cp, release, name):
    """CoreV1Api and CustomObjectsApi carrying a token of the chart's agent service
    account, as the agent makes its requests (kubectl would read before it patches)."""
    import kubernetes

    token = cp.kubectl("-n", release, "create", "token", "tailcut-agent").stdout.strip()
    client = kubernetes.config.new_client_from_config(
        config_file=str(cp.user_kubeconfig(name, token)))
    return kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client)
