"""What the operator may change on a pod (helm/tailcut/templates/operator-pod-policy.yaml),
against the real API server the session's release was installed into: as the chart's
operator service account, with its own token, the operator's one pod write (lower
spec.activeDeadlineSeconds to 1 on a pod a TrainingJob controls, operator/handlers.py
_stop_pods) is allowed, and anything else RBAC would let through (another spec field,
a label, an annotation, another deadline, a pod no TrainingJob controls) is refused by
the policy, which the refusal names. The same updates by someone else are allowed: the
refusals are the policy's, not the API server's own validation. (The operator itself
runs under the policy in test_operator.py and test_operator_background.py, which check
that it stops failed and finished jobs' pods.)

Refusals are 422 (the policy's reason Invalid), not 403: test_operator.py reads any 403
in the operator's audit trail as a right its ClusterRole lacks."""

import json
import subprocess
import uuid

import pytest
import yaml

from tailcut.k8s.manifests import resources
from tailcut.k8s.node import devcluster
from tests.k8s import operator_proc
from tests.k8s.conftest import CHART, operator_kubeconfig

pytestmark = pytest.mark.k8s
POLICY = "tailcut-operator-pod-updates"
API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
STOP = {"spec": {"activeDeadlineSeconds": 1}}   # what _stop_pods() sends


def _render(*args: str) -> list[dict]:
    out = subprocess.run([str(devcluster.helm_binary()), "template", "tailcut", str(CHART),
                          "--namespace", "ns-x", *args],
                         capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_the_policy_is_rendered_where_the_api_exists_unless_turned_off():
    kinds = lambda docs: sorted(d["kind"] for d in docs if "Admission" in d["kind"])
    both = ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    assert kinds(_render("--api-versions", API)) == both
    assert kinds(_render()) == []   # no cluster, no such API known: none
    assert kinds(_render("--api-versions", API, "--set", "operator.podUpdatePolicy=false")) == []
    (policy,) = [d for d in _render("--api-versions", API)
                 if d["kind"] == "ValidatingAdmissionPolicy"]
    (match,) = policy["spec"]["matchConditions"]
    assert "'system:serviceaccount:ns-x:tailcut-operator'" in match["expression"]


def _pod(cp, namespace, name, owned=True):
    job = "k8-stopme"
    meta = {"name": name, "labels": {resources.LABEL_JOB: job, resources.LABEL_REPLICA: "ps-0"},
            "annotations": {"keep": "me"}}
    if owned:   # as the operator makes them (resources.owner_reference); no GC runs here
        meta["ownerReferences"] = [{
            "apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob", "name": job,
            "uid": str(uuid.uuid4()), "controller": True, "blockOwnerDeletion": True}]
    cp.kubectl("-n", namespace, "create", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"containers": [{"name": "c", "image": "registry.example/good:1"}]}}))


def _refusal(call) -> str:
    """The message of a refused request (a 422 from the policy), failing if it passed."""
    import kubernetes

    try:
        call()
    except kubernetes.client.ApiException as err:
        assert err.status == 422, (err.status, err.body)
        return json.loads(err.body)["message"]
    raise AssertionError("the update was allowed")


def test_the_operator_may_only_lower_a_deadline_of_its_jobs_pods(control_plane, release,
                                                                   namespace):
    import kubernetes

    cp = control_plane
    installed = operator_proc.get_json(cp, "get", "validatingadmissionpolicybinding", POLICY)
    assert installed["spec"]["validationActions"] == ["Deny"]
    _pod(cp, namespace, "k8-stopme-ps-0")
    _pod(cp, namespace, "k8-stray", owned=False)
    core = kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(
        config_file=str(operator_kubeconfig(cp, release, "operator-pod-policy"))))
    evil_image = {"spec": {"containers": [{"name": "c", "image": "registry.example/evil:1"}]}}

    def refused(body, name="k8-stopme-ps-0", dry_run=None):
        return _refusal(lambda: core.patch_namespaced_pod(name, namespace, body,
                                                          dry_run=dry_run))

    # The binding is read by the API server's informer a moment after it exists: until
    # the image patch (server-side dry run, nothing stored) is refused.
    def enforced():
        try:
            return refused(evil_image, dry_run="All")
        except AssertionError:
            return None
    said = operator_proc.wait_for(enforced, 30, "the policy to be enforced")
    assert f"ValidatingAdmissionPolicy '{POLICY}'" in said, said
    assert "spec.containers" in said, said

    assert "spec.containers" in refused(evil_image)
    said = refused({"metadata": {"labels": {resources.LABEL_JOB: "someone-else"}}})
    assert POLICY in said and "metadata.labels" in said, said
    said = refused({"metadata": {"annotations": {"tailcut.dev/network": "{}"}}})
    assert POLICY in said and "metadata.annotations" in said, said
    said = refused({"metadata": {"ownerReferences": None}})
    assert POLICY in said and "metadata.ownerReferences" in said, said
    said = refused({"spec": {"activeDeadlineSeconds": 5}})
    assert POLICY in said and "not to 5" in said, said
    said = refused({"spec": {"activeDeadlineSeconds": 1, "tolerations": [
        {"key": "k", "operator": "Exists", "effect": "NoSchedule"}]}})
    assert POLICY in said and "spec.tolerations" in said, said
    said = refused(STOP, name="k8-stray")   # no TrainingJob controls it
    assert POLICY in said and "pods a TrainingJob controls" in said, said

    core.patch_namespaced_pod("k8-stopme-ps-0", namespace, STOP)   # the operator's own
    pod = operator_proc.get_json(cp, "-n", namespace, "get", "pod", "k8-stopme-ps-0")
    assert pod["spec"]["activeDeadlineSeconds"] == 1
    assert pod["spec"]["containers"][0]["image"] == "registry.example/good:1"
    assert pod["metadata"]["labels"][resources.LABEL_JOB] == "k8-stopme"
    assert pod["metadata"]["annotations"] == {"keep": "me"}
    assert len(pod["metadata"]["ownerReferences"]) == 1

    # Everyone else is as before: the API server itself takes these updates.
    for body in (evil_image, {"metadata": {"labels": {resources.LABEL_JOB: "someone-else"}}}):
        cp.kubectl("-n", namespace, "patch", "pod", "k8-stopme-ps-0", "-p", json.dumps(body))
    pod = operator_proc.get_json(cp, "-n", namespace, "get", "pod", "k8-stopme-ps-0")
    assert pod["spec"]["containers"][0]["image"] == "registry.example/evil:1"
