"""bounded-loss jobs through the operator against the real kube-apiserver: their pods
carry the XDP counter's privileges (and only theirs); a cluster whose chart disables
them, or a namespace whose Pod Security level forbids them, fails the job with a
condition naming the setting or the rule, instead of retrying forever."""

import pytest
import yaml

from tests.k8s import operator_proc

pytestmark = pytest.mark.k8s

BOUNDED_LOSS = {"replicas": {"workers": 1}, "transport": {"type": "bounded-loss", "p": 0.9}}


@pytest.fixture
def start_operator(control_plane, tmp_path):
    """An operator for one namespace, with extra env. The admin's kubeconfig: kopf
    watching a named namespace also lists namespaces, which the chart's role (for an
    operator watching all of them) does not grant; the RBAC is tested in
    test_operator.py. Pod Security admission applies to every user alike."""
    started = []

    def start(namespace, **env):
        log = tmp_path / f"operator-{len(started)}.log"
        started.append(operator_proc.start(control_plane.kubeconfig, log,
                                           namespace=namespace, extra_env=env))
        return log
    yield start
    for proc in started:
        operator_proc.stop(proc)


def apply(cp, namespace, name, job_spec):
    cp.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(
        {"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
         "metadata": {"name": name}, "spec": job_spec}))


def wait_failed(cp, namespace, name, log):
    def check():
        tj = operator_proc.get_json(cp, "-n", namespace, "get", "trainingjob", name)
        return tj if (tj.get("status") or {}).get("phase") == "Failed" else None
    tj = operator_proc.wait_for(check, 60, f"{namespace}/{name} to fail", log)
    return {c["type"]: c for c in tj["status"]["conditions"]}["Failed"]


def opt_in(cp, namespace):
    """What a cluster admin does to let bounded-loss jobs run in `namespace`."""
    cp.kubectl("label", "namespace", namespace, "tailcut.dev/bounded-loss=allowed")


def test_the_pods_of_a_bounded_loss_job_get_the_xdp_privileges(control_plane, namespace,
                                                                 start_operator):
    opt_in(control_plane, namespace)
    log = start_operator(namespace)
    apply(control_plane, namespace, "xdp-ok", BOUNDED_LOSS)
    pods = operator_proc.wait_for(lambda: [
        p for p in operator_proc.get_json(control_plane, "-n", namespace, "get",
                                          "pods")["items"]] or None, 60, "the pods", log)
    for pod in pods:
        caps = pod["spec"]["containers"][0]["securityContext"]["capabilities"]
        assert caps == {"drop": ["ALL"], "add": ["BPF", "NET_ADMIN", "PERFMON"]}


def test_a_chart_that_disables_xdp_refuses_bounded_loss_naming_the_setting(
        control_plane, namespace, start_operator):
    log = start_operator(namespace, TAILCUT_WORKER_XDP="false")
    apply(control_plane, namespace, "xdp-off", BOUNDED_LOSS)
    failed = wait_failed(control_plane, namespace, "xdp-off", log)
    assert failed["reason"] == "InvalidSpec"
    assert "workers.xdp.enabled=false" in failed["message"]
    assert not operator_proc.get_json(control_plane, "-n", namespace, "get", "pods")["items"]
    # tcp needs no privilege: the same cluster runs it.
    apply(control_plane, namespace, "xdp-off-tcp", {"replicas": {"workers": 1}})
    operator_proc.wait_for(lambda: operator_proc.get_json(
        control_plane, "-n", namespace, "get", "pods")["items"] or None, 60, "tcp pods", log)


def test_a_namespace_whose_pod_security_forbids_it_fails_the_job_naming_the_rule(
        control_plane, namespace, start_operator):
    opt_in(control_plane, namespace)
    control_plane.kubectl("label", "namespace", namespace,
                          "pod-security.kubernetes.io/enforce=baseline")
    log = start_operator(namespace)
    apply(control_plane, namespace, "xdp-psa", BOUNDED_LOSS)
    failed = wait_failed(control_plane, namespace, "xdp-psa", log)
    assert failed["reason"] == "PodForbidden"
    assert "violates PodSecurity" in failed["message"] and "baseline" in failed["message"]
    assert "NET_ADMIN" in failed["message"]
