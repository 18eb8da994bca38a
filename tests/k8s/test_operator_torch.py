"""Torch and DDP/Gloo jobs through the operator against the real kube-apiserver: their
pods run the worker image with PyTorch (the chart's workers.torchImage), every other
job's the small one; a cluster whose chart names no torch image fails such a job at
once, naming the value, and creates nothing."""

import pytest

from tests.k8s import operator_proc
from tests.k8s.test_operator_xdp import apply, start_operator, wait_failed  # noqa: F401

pytestmark = pytest.mark.k8s

TORCH_IMAGE = "tailcut/worker-torch:test"
TORCH_PS = {"replicas": {"workers": 1}, "training": {"model": "torch-mlp"}}
ALLREDUCE = {"replicas": {"workers": 2},
             "training": {"model": "torch-mlp", "syncMode": "allreduce"}}


def images_of(cp, namespace, job, log, count):
    """The images of job's pods, once all ``count`` of them exist (the operator
    creates them one by one: the first alone is not the answer)."""
    def pods():
        items = operator_proc.get_json(cp, "-n", namespace, "get", "pods", "-l",
                                       f"tailcut.dev/job={job}")["items"]
        return items if len(items) >= count else None
    found = operator_proc.wait_for(pods, 60, f"the {count} pods of {job}", log)
    return {p["metadata"]["name"]: p["spec"]["containers"][0]["image"] for p in found}


def test_torch_and_allreduce_pods_run_the_torch_image_and_others_the_worker_image(
        control_plane, namespace, start_operator):  # noqa: F811
    log = start_operator(namespace, TAILCUT_WORKER_TORCH_IMAGE=TORCH_IMAGE)
    apply(control_plane, namespace, "tps", TORCH_PS)
    apply(control_plane, namespace, "gloo", ALLREDUCE)
    apply(control_plane, namespace, "plain", {"replicas": {"workers": 1}})
    torch_ps = images_of(control_plane, namespace, "tps", log, 2)
    assert set(torch_ps) == {"tps-ps-0", "tps-worker-0"}
    assert set(torch_ps.values()) == {TORCH_IMAGE}
    gloo = images_of(control_plane, namespace, "gloo", log, 2)
    assert set(gloo) == {"gloo-worker-0", "gloo-worker-1"}   # no PS
    assert set(gloo.values()) == {TORCH_IMAGE}
    assert set(images_of(control_plane, namespace, "plain", log, 2).values()) == {
        "tailcut/worker:test"}


def test_a_chart_without_a_torch_image_refuses_torch_jobs_naming_the_value(
        control_plane, namespace, start_operator):  # noqa: F811
    log = start_operator(namespace, TAILCUT_WORKER_TORCH_IMAGE="")
    apply(control_plane, namespace, "tps", TORCH_PS)
    apply(control_plane, namespace, "gloo", ALLREDUCE)
    for job, field in (("tps", "spec.training.model=torch-mlp"),
                       ("gloo", "spec.training.syncMode=allreduce")):
        failed = wait_failed(control_plane, namespace, job, log)
        assert failed["reason"] == "InvalidSpec"
        assert failed["message"].startswith(field), failed["message"]
        assert "workers.torchImage" in failed["message"]
        assert "tailcut images build --torch" in failed["message"]
    assert not operator_proc.get_json(control_plane, "-n", namespace, "get", "pods")["items"]
