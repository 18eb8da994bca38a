"""The chart against a real API server, and the operator running with the chart's RBAC
(a service-account token, not cluster-admin): CRD served, bad specs rejected by the
API server naming the field, pods/service/config map created with owners and labels,
phases and a clear condition on pod failure. The last test reads the API server's
audit log to prove the operator's ClusterRole lacks nothing and grants nothing unused."""

import json
import threading
import time
from pathlib import Path

import pytest
import yaml

from tailcut.k8s.manifests import crd, resources
from tailcut.k8s.node import devcluster
from tests.k8s import audit, operator_proc, test_overlay_ids
from tests.k8s.conftest import CHART, RELEASE_NS, helm, operator_kubeconfig

pytestmark = pytest.mark.k8s
REPO = Path(__file__).resolve().parents[2]
OPERATOR_USER = f"system:serviceaccount:{RELEASE_NS}:tailcut-operator"




@pytest.fixture(scope="module")
def operator(control_plane, release, tmp_path_factory):
    """The operator as the chart's service account, watching every namespace."""
    kubeconfig = operator_kubeconfig(control_plane, release, "operator")
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    proc = operator_proc.start(kubeconfig, log)
    try:
        yield log
    finally:
        operator_proc.stop(proc)


def job_yaml(name, spec):
    return yaml.safe_dump({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                           "metadata": {"name": name}, "spec": spec})


def test_helm_lint_and_template_pass(control_plane):
    lint = helm(control_plane, "lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in lint.stdout
    rendered = list(yaml.safe_load_all(helm(control_plane, "template", "tailcut", str(CHART),
                                            "--namespace", RELEASE_NS,
                                            "--include-crds").stdout))
    kinds = sorted({d["kind"] for d in rendered if d})
    assert {"CustomResourceDefinition", "ClusterRole", "Deployment", "DaemonSet",
            "ServiceAccount", "Pod"} <= set(kinds)


def test_values_schema_rejects_an_unknown_backend(control_plane):
    bad = helm(control_plane, "template", "tailcut", str(CHART), "--set",
               "operator.backend=docker", check=False)
    assert bad.returncode != 0
    assert "operator.backend" in bad.stderr


def test_helm_install_creates_the_operator_and_agent(control_plane, release):
    deploy = operator_proc.get_json(control_plane, "-n", release, "get", "deployment",
                                    "tailcut-operator")
    assert deploy["spec"]["template"]["spec"]["serviceAccountName"] == "tailcut-operator"
    ds = operator_proc.get_json(control_plane, "-n", release, "get", "daemonset",
                                "tailcut-agent")
    sc = ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert sc["capabilities"]["drop"] == ["ALL"] and "NET_ADMIN" in sc["capabilities"]["add"]
    assert not sc.get("privileged")


def test_helm_test_hook_runs_its_pod(control_plane, release):
    """No kubelet runs here, so this test plays it: it marks the hook pod Succeeded
    once helm has created it. What this shows is the hook's wiring, not its check
    (test_privileges.py runs the check as the pod's account); and that the pod has an
    account of its own, not the operator's powerful one."""
    accounts = []

    def kubelet():
        name = f"tailcut-test-crd"
        for _ in range(200):
            got = control_plane.kubectl("-n", release, "get", "pod", name, "-o", "json",
                                        check=False)
            if got.returncode == 0:
                accounts.append(json.loads(got.stdout)["spec"]["serviceAccountName"])
                control_plane.kubectl("-n", release, "patch", "pod", name,
                                      "--subresource=status", "--type=merge", "-p",
                                      json.dumps({"status": {"phase": "Succeeded"}}))
                return
            time.sleep(0.2)
    threading.Thread(target=kubelet, daemon=True).start()
    result = helm(control_plane, "test", "tailcut", "--namespace", release, "--timeout", "60s")
    assert "Phase:          Succeeded" in result.stdout
    assert accounts == ["tailcut-test"]


def test_crd_is_served(control_plane):
    out = control_plane.kubectl("api-resources", "--api-group", crd.GROUP).stdout
    assert "trainingjobs" in out and "TrainingJob" in out


@pytest.mark.parametrize("spec,field,words", [
    ({"replicas": {"workers": "four"}}, "spec.replicas.workers", "must be of type integer"),
    ({"replicas": {"workers": 0}}, "spec.replicas.workers", "greater than or equal to 1"),
    ({"network": {"accessLink": {"loss": 1.5}}}, "spec.network.accessLink.loss",
     "less than or equal to 1"),
    ({"training": {"model": "resnet"}}, "spec.training.model", "Unsupported value"),
    ({"scheduling": {"policy": "fastest"}}, "spec.scheduling.policy", "Unsupported value"),
    ({"backgroundLoad": {"flowSizes": {"distribution": "zipf"}}},
     "spec.backgroundLoad.flowSizes.distribution", "Unsupported value"),
    ({"network": {"accessLink": {"bandwidth": "10Gbps"}}}, "spec.network.accessLink.bandwidth",
     "should match"),
])
def test_api_server_rejects_an_invalid_spec_naming_the_field(control_plane, namespace, spec,
                                                             field, words):
    result = control_plane.kubectl("-n", namespace, "apply", "-f", "-",
                                   input=job_yaml("k8-bad", spec), check=False)
    assert result.returncode != 0
    assert field in result.stderr and words in result.stderr, result.stderr
    assert "k8-bad" not in control_plane.kubectl("-n", namespace, "get", "trainingjobs").stdout


def test_api_server_rejects_p_above_one_when_the_transport_has_p(control_plane, namespace):
    transport = crd.spec_schema()["properties"]["transport"]["properties"]
    if "p" not in transport:
        pytest.skip("spec.transport.p arrives with the bounded-loss transport")
    kind = next(t for t in transport["type"]["enum"] if t != "tcp")
    result = control_plane.kubectl("-n", namespace, "apply", "-f", "-", check=False,
                                   input=job_yaml("k8-bad-p", {"transport": {"type": kind,
                                                                             "p": 1.5}}))
    assert result.returncode != 0 and "spec.transport.p" in result.stderr


def test_api_server_rejects_an_unknown_field_naming_it(control_plane, namespace):
    result = control_plane.kubectl("-n", namespace, "apply", "-f", "-", check=False,
                                   input=job_yaml("k8-typo", {"training": {"modle": "mlp"}}))
    assert result.returncode != 0 and "spec.training.modle" in result.stderr


def _wait_job(cp, namespace, name, phase, log):
    def check():
        tj = operator_proc.get_json(cp, "-n", namespace, "get", "trainingjob", name)
        return tj if (tj.get("status") or {}).get("phase") == phase else None
    return operator_proc.wait_for(check, 60, f"{namespace}/{name} to be {phase}", log)


def test_jobs_whose_names_hash_to_the_same_24_bits_get_different_overlay_ids(
        control_plane, namespace, operator):
    """A job's VXLAN id is the operator's to give, unique in the cluster: two names of
    one namespace that a 24-bit hash of <namespace>/<job> could not tell apart get two
    ids, each recorded in its job's status (the agents take it from there)."""
    names = test_overlay_ids.colliding_names(namespace, prefix="k8-vni")
    for name in names:
        control_plane.kubectl("-n", namespace, "apply", "-f", "-",
                              input=job_yaml(name, {"replicas": {"workers": 1}}))

    def overlay_id(name):
        tj = operator_proc.get_json(control_plane, "-n", namespace, "get", "trainingjob", name)
        return (tj.get("status") or {}).get("overlayId")
    ids = [operator_proc.wait_for(lambda n=n: overlay_id(n), 60, f"{n}'s overlayId", operator)
           for n in names]
    assert ids[0] != ids[1] and all(1 <= i < 2 ** 24 for i in ids)
    # and none is held by another job of the cluster
    everyone = operator_proc.get_json(control_plane, "get", "trainingjobs", "-A")["items"]
    held = [(j.get("status") or {}).get("overlayId") for j in everyone]
    assert all(held.count(i) == 1 for i in ids)


def test_a_valid_job_gets_pods_service_and_config_map_owned_by_it(control_plane, namespace,
                                                                    operator):
    control_plane.kubectl("-n", namespace, "apply", "-f", "-", input=job_yaml(
        "k8-ok", {"replicas": {"workers": 2}, "training": {"epochs": 3}}))
    tj = _wait_job(control_plane, namespace, "k8-ok", "Pending", operator)
    uid = tj["metadata"]["uid"]
    pods = operator_proc.get_json(control_plane, "-n", namespace, "get", "pods", "-l",
                                  f"{resources.LABEL_JOB}=k8-ok")["items"]
    assert sorted(p["metadata"]["labels"][resources.LABEL_REPLICA] for p in pods) == [
        "ps-0", "worker-0", "worker-1"]
    svc = operator_proc.get_json(control_plane, "-n", namespace, "get", "service", "k8-ok")
    cm = operator_proc.get_json(control_plane, "-n", namespace, "get", "configmap", "k8-ok-spec")
    for obj in pods + [svc, cm]:
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "TrainingJob", "k8-ok", uid, True)
        assert obj["metadata"]["labels"][resources.LABEL_JOB] == "k8-ok"
    assert svc["spec"]["clusterIP"] == "None"
    stored = yaml.safe_load(cm["data"][resources.SPEC_KEY])
    assert stored["spec"]["training"]["epochs"] == 3
    assert stored["spec"]["network"]["accessLink"]["bandwidth"] == "1Gbit"  # for the agent
    assert tj["status"]["observedGeneration"] == tj["metadata"]["generation"]
    # Recorded for the node agents, which build from the job and nothing else (no
    # node runs here: no placement).
    assert tj["status"]["specGeneration"] == tj["metadata"]["generation"]
    assert tj["status"]["placement"] == {}
    assert "placement.json" not in cm["data"]
    created = {c["type"]: c for c in tj["status"]["conditions"]}["Created"]
    assert created["status"] == "True"
    assert created["observedGeneration"] == tj["metadata"]["generation"]
    # Every pod meets Pod Security's restricted level (tcp), and states its requests
    # (a ResourceQuota on requests admits it).
    for pod in pods:
        assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        (container,) = pod["spec"]["containers"]
        sc = container["securityContext"]
        assert (sc["runAsNonRoot"], sc["allowPrivilegeEscalation"],
                sc["capabilities"]) == (True, False, {"drop": ["ALL"]})
        assert container["resources"]["requests"] == resources.DEFAULT_RESOURCES["requests"]


def _set_pod_phase(cp, namespace, name, phase, exit_code=None,
                   message="gradient shape mismatch", finished_at=None):
    status = {"phase": phase}
    if exit_code is not None:
        terminated = {"exitCode": exit_code, "reason": "Error", "message": message}
        if finished_at:
            terminated["finishedAt"] = finished_at
        status["containerStatuses"] = [{
            "name": "worker", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
            "state": {"terminated": terminated}}]
    cp.kubectl("-n", namespace, "patch", "pod", name, "--subresource=status",
               "--type=merge", "-p", json.dumps({"status": status}))


def test_job_runs_then_fails_with_a_condition_naming_the_failed_pod(control_plane, namespace,
                                                                    operator):
    control_plane.kubectl("-n", namespace, "apply", "-f", "-",
                          input=job_yaml("k8-fail", {"replicas": {"workers": 2}}))
    _wait_job(control_plane, namespace, "k8-fail", "Pending", operator)
    for replica in ("ps-0", "worker-0", "worker-1"):   # play the kubelet
        _set_pod_phase(control_plane, namespace, f"k8-fail-{replica}", "Running")
    tj = _wait_job(control_plane, namespace, "k8-fail", "Running", operator)
    assert tj["status"]["replicaStatuses"]["Worker"]["active"] == 2
    _set_pod_phase(control_plane, namespace, "k8-fail-worker-1", "Failed", exit_code=3)
    tj = _wait_job(control_plane, namespace, "k8-fail", "Failed", operator)
    failed = {c["type"]: c for c in tj["status"]["conditions"]}["Failed"]
    assert failed["status"] == "True" and failed["reason"] == "PodFailed"
    assert "k8-fail-worker-1" in failed["message"] and "code 3" in failed["message"]
    assert "gradient shape mismatch" in failed["message"]
    assert tj["status"]["replicaStatuses"]["Worker"]["failed"] == 1
    # The pods still running stop now (their kubelet ends them at this deadline,
    # keeping their logs), not when they give up on the peer that failed.
    operator_proc.wait_for(lambda: all(
        operator_proc.get_json(control_plane, "-n", namespace, "get", "pod", f"k8-fail-{r}")[
            "spec"].get("activeDeadlineSeconds") == 1 for r in ("ps-0", "worker-0")),
        30, "the running pods' deadline lowered to 1 s", operator)
    failed_pod = operator_proc.get_json(control_plane, "-n", namespace, "get", "pod",
                                        "k8-fail-worker-1")
    assert "activeDeadlineSeconds" not in failed_pod["spec"], "an ended pod is left alone"
    events = operator_proc.wait_for(lambda: [
        e for e in operator_proc.get_json(control_plane, "-n", namespace, "get",
                                          "events")["items"]
        if e["involvedObject"]["name"] == "k8-fail" and e["reason"] == "PodFailed"],
        30, "the PodFailed event", operator)
    assert "k8-fail-worker-1" in events[0]["message"]


def test_a_pod_its_agent_refuses_for_good_fails_the_job_at_once_with_events(
        control_plane, namespace, operator):
    """The agent writes a refusal no retry mends on the pod (here as the agent's
    service account would, through pods/status); the job fails now, naming it, instead
    of the pod waiting 120 s for tc0 with nothing in the job's status."""
    control_plane.kubectl("-n", namespace, "apply", "-f", "-",
                          input=job_yaml("k8-refused", {"replicas": {"workers": 1}}))
    _wait_job(control_plane, namespace, "k8-refused", "Pending", operator)
    said = ("node n1: k8/k8-refused-ps-0: not wired: its process 42 is in the node's "
            "network namespace")
    control_plane.kubectl("-n", namespace, "patch", "pod", "k8-refused-ps-0",
                          "--subresource=status", "--type=merge", "-p", json.dumps({
                              "metadata": {"annotations": {
                                  resources.ANNOTATION_WIRING_ERROR: said,
                                  resources.ANNOTATION_REFUSED: said}}}))
    tj = _wait_job(control_plane, namespace, "k8-refused", "Failed", operator)
    failed = {c["type"]: c for c in tj["status"]["conditions"]}["Failed"]
    assert (failed["status"], failed["reason"]) == ("True", "AgentRefused")
    assert failed["message"] == f"k8-refused-ps-0: {said}"
    assert tj["status"]["wiringErrors"] == {"ps-0": said}
    reasons = operator_proc.wait_for(lambda: {
        e["reason"] for e in operator_proc.get_json(control_plane, "-n", namespace, "get",
                                                    "events")["items"]
        if e["involvedObject"]["name"] == "k8-refused"} >= {"AgentRefused", "WiringFailed"},
        30, "the AgentRefused and WiringFailed events", operator)
    assert reasons


def test_a_job_asking_more_kernel_queue_memory_than_its_namespace_allows_is_refused(
        control_plane, namespace, operator):
    """The issue's uplink of 8 kbit/s with a 1 GB buffer: refused before anything is
    created, naming the field and the limit; with the namespace's limit raised by an
    admin's annotation it is created, the memory its queues may hold in its status."""
    deep = {"replicas": {"workers": 1},
            "network": {"uplink": {"bandwidth": "8kbit", "bufferBytes": 1_000_000_000}}}
    control_plane.kubectl("-n", namespace, "apply", "-f", "-", input=job_yaml("k8-deep", deep))
    tj = _wait_job(control_plane, namespace, "k8-deep", "Failed", operator)
    created = {c["type"]: c for c in tj["status"]["conditions"]}["Created"]
    assert (created["status"], created["reason"]) == ("False", "KernelLimitExceeded")
    assert created["message"].startswith(
        "spec.network.uplink.bufferBytes: a link end's queues may hold 1338177024 bytes of "
        "kernel memory, above the limit of 67108864 per link end")
    assert "tailcut.dev/max-link-queue-bytes" in created["message"]
    assert not operator_proc.get_json(control_plane, "-n", namespace, "get", "pods", "-l",
                                      f"{resources.LABEL_JOB}=k8-deep")["items"]
    control_plane.kubectl("annotate", "namespace", namespace,
                          "tailcut.dev/max-link-queue-bytes=2000000000",
                          "tailcut.dev/max-job-queue-bytes=8000000000")
    control_plane.kubectl("-n", namespace, "apply", "-f", "-",
                          input=job_yaml("k8-deep-ok", deep))
    tj = _wait_job(control_plane, namespace, "k8-deep-ok", "Pending", operator)
    assert tj["status"]["queueMemoryBytes"] == 2 * 1338177024 + 2 * 2 * 2026000


def test_job_succeeds_when_its_workers_succeed(control_plane, namespace, operator):
    control_plane.kubectl("-n", namespace, "apply", "-f", "-",
                          input=job_yaml("k8-win", {"replicas": {"workers": 1}}))
    _wait_job(control_plane, namespace, "k8-win", "Pending", operator)
    _set_pod_phase(control_plane, namespace, "k8-win-ps-0", "Running")
    _set_pod_phase(control_plane, namespace, "k8-win-worker-0", "Succeeded")
    tj = _wait_job(control_plane, namespace, "k8-win", "Succeeded", operator)
    assert tj["status"]["completionTime"]


def test_queue_drops_the_agents_record_on_ended_pods_reach_the_status(control_plane,
                                                                     namespace, operator):
    control_plane.kubectl("-n", namespace, "apply", "-f", "-",
                          input=job_yaml("k8-drops", {"replicas": {"workers": 1}}))
    _wait_job(control_plane, namespace, "k8-drops", "Pending", operator)
    _set_pod_phase(control_plane, namespace, "k8-drops-ps-0", "Running")
    _set_pod_phase(control_plane, namespace, "k8-drops-worker-0", "Succeeded")
    _wait_job(control_plane, namespace, "k8-drops", "Succeeded", operator)
    # As the node agent does when it releases each pod, after the job has ended: the
    # shared uplink's count grew between the two.
    for pod, drops in (("k8-drops-worker-0", {"worker-0/tc0": 7, "rack-0/up": 3}),
                       ("k8-drops-ps-0", {"ps-0/tc0": 0, "rack-0/up": 5})):
        control_plane.kubectl("-n", namespace, "annotate", "pod", pod,
                              f"{resources.ANNOTATION_QUEUE_DROPS}={json.dumps(drops)}")
    expected = {"total": 12, "byLinkEnd": {"ps-0/tc0": 0, "rack-0/up": 5,
                                           "worker-0/tc0": 7}}
    operator_proc.wait_for(lambda: operator_proc.get_json(
        control_plane, "-n", namespace, "get", "trainingjob", "k8-drops")["status"].get(
            "queueDrops") == expected, 60, "status.queueDrops", operator)


def test_a_config_map_of_the_jobs_name_made_by_someone_else_is_refused_not_adopted(
        control_plane, namespace, operator):
    squatted = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "k8-squat-spec"},
                "data": {resources.SPEC_KEY: "not the job's"}}
    control_plane.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(squatted))
    control_plane.kubectl("-n", namespace, "apply", "-f", "-",
                          input=job_yaml("k8-squat", {"replicas": {"workers": 1}}))
    tj = _wait_job(control_plane, namespace, "k8-squat", "Failed", operator)
    failed = {c["type"]: c for c in tj["status"]["conditions"]}["Failed"]
    assert failed["reason"] == "ObjectNotOwned"
    assert (f"ConfigMap {namespace}/k8-squat-spec already exists and this TrainingJob "
            f"(uid {tj['metadata']['uid']}) does not control it") in failed["message"]
    cm = operator_proc.get_json(control_plane, "-n", namespace, "get", "configmap",
                                "k8-squat-spec")
    assert cm["data"] == squatted["data"] and "ownerReferences" not in cm["metadata"], \
        "left as it was"
    assert not operator_proc.get_json(control_plane, "-n", namespace, "get", "pods")["items"]
    assert control_plane.kubectl("-n", namespace, "get", "service", "k8-squat",
                                 check=False).returncode != 0, "nothing more was created"
    operator_proc.wait_for(lambda: [
        e for e in operator_proc.get_json(control_plane, "-n", namespace, "get",
                                          "events")["items"]
        if e["involvedObject"]["name"] == "k8-squat" and e["reason"] == "ObjectNotOwned"
        and "k8-squat-spec" in e["message"]], 30, "the ObjectNotOwned event", operator)


def _end_pod(cp, namespace, name, phase, exit_code, message):
    cp.kubectl("-n", namespace, "patch", "pod", name, "--subresource=status", "--type=merge",
               "-p", json.dumps({"status": {"phase": phase, "containerStatuses": [{
                   "name": "c", "image": "x", "imageID": "", "ready": False,
                   "restartCount": 0, "state": {"terminated": {
                       "exitCode": exit_code, "reason": "Error", "message": message}}}]}}))


def test_pods_with_the_jobs_labels_that_it_does_not_control_change_nothing(
        control_plane, namespace, operator):
    cp = control_plane
    cp.kubectl("-n", namespace, "apply", "-f", "-",
               input=job_yaml("k8-fake", {"replicas": {"workers": 1}}))
    tj = _wait_job(cp, namespace, "k8-fake", "Pending", operator)
    labels = {resources.LABEL_JOB: "k8-fake", resources.LABEL_REPLICA: "ps-0"}
    done = json.dumps({"event": "done", "jct_s": 0.5, "final_accuracy": 0.99,
                       "final_loss": 0.01, "converged": True, "epochs": 1})
    forged_owner = resources.owner_reference(tj)   # anyone who can read the job can
    fakes = [   # a pod labelled ps-0 that fails, and one that claims the job and reports
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "k8-fake-evil", "labels": labels},
         "spec": {"containers": [{"name": "c", "image": "x"}]}},
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "k8-fake-forged",
                      "labels": {**labels, resources.LABEL_REPLICA: "replica-0"},
                      "ownerReferences": [forged_owner]},
         "spec": {"containers": [{"name": "c", "image": "x"}]}}]
    cp.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump_all(fakes))
    _end_pod(cp, namespace, "k8-fake-evil", "Failed", 3, "fail the job")
    _end_pod(cp, namespace, "k8-fake-forged", "Succeeded", 0, done)
    for replica in ("ps-0", "worker-0"):   # play the kubelet for the job's own pods
        _set_pod_phase(cp, namespace, f"k8-fake-{replica}", "Running")
    tj = _wait_job(cp, namespace, "k8-fake", "Running", operator)
    assert tj["status"]["replicaStatuses"]["PS"] == {"active": 1, "succeeded": 0, "failed": 0}
    _set_pod_phase(cp, namespace, "k8-fake-worker-0", "Succeeded")
    tj = _wait_job(cp, namespace, "k8-fake", "Succeeded", operator)
    assert "jctSeconds" not in tj["status"] and "accuracy" not in tj["status"], tj["status"]
    assert "evil" not in tj["status"]["message"] and "forged" not in tj["status"]["message"]
    ps_0 = operator_proc.get_json(cp, "-n", namespace, "get", "pod", "k8-fake-ps-0")
    assert "activeDeadlineSeconds" not in ps_0["spec"], "a succeeded job's PS may finish"


def test_a_spec_change_after_start_is_reported_not_silently_ignored(control_plane, namespace,
                                                                      operator):
    control_plane.kubectl("-n", namespace, "apply", "-f", "-",
                          input=job_yaml("k8-edit", {"replicas": {"workers": 1}}))
    _wait_job(control_plane, namespace, "k8-edit", "Pending", operator)
    control_plane.kubectl("-n", namespace, "patch", "trainingjob", "k8-edit", "--type=merge",
                          "-p", json.dumps({"spec": {"training": {"epochs": 5}}}))

    def reported():
        tj = operator_proc.get_json(control_plane, "-n", namespace, "get", "trainingjob",
                                    "k8-edit")
        return tj if "not applied" in (tj["status"].get("message") or "") else None
    tj = operator_proc.wait_for(reported, 30, "the spec change to be reported", operator)
    # The status still describes the spec the pods were made from: nothing applied 2.
    assert tj["metadata"]["generation"] == 2
    assert tj["status"]["observedGeneration"] == 1
    assert {c["observedGeneration"] for c in tj["status"]["conditions"]} == {1}
    # A pod event recomputes the status: still generation 1.
    _set_pod_phase(control_plane, namespace, "k8-edit-ps-0", "Running")
    operator_proc.wait_for(lambda: operator_proc.get_json(
        control_plane, "-n", namespace, "get", "pods", "k8-edit-ps-0")["status"]["phase"]
        == "Running", 30, "ps-0 Running", operator)
    time.sleep(2)
    tj = operator_proc.get_json(control_plane, "-n", namespace, "get", "trainingjob",
                                "k8-edit")
    assert tj["status"]["observedGeneration"] == 1, tj["status"]


def test_operator_restart_creates_nothing_twice(control_plane, namespace, release, operator,
                                                tmp_path):
    control_plane.kubectl("-n", namespace, "apply", "-f", "-",
                          input=job_yaml("k8-again", {"replicas": {"workers": 1}}))
    _wait_job(control_plane, namespace, "k8-again", "Pending", operator)
    log = tmp_path / "second.log"
    # A second operator, with the chart's identity, resuming every job as after a restart.
    second = operator_proc.start(operator_kubeconfig(control_plane, release, "operator2"), log)
    try:
        operator_proc.wait_for(lambda: "k8-again" in log.read_text(errors="replace")
                               and "succeeded" in log.read_text(errors="replace"),
                               60, "the resumed reconcile", log)
    finally:
        operator_proc.stop(second)
    pods = operator_proc.get_json(control_plane, "-n", namespace, "get", "pods")["items"]
    assert len(pods) == 2
    assert "Traceback" not in log.read_text()


def test_a_spec_only_the_models_refuse_fails_the_job_with_an_event(control_plane, namespace,
                                                                   operator):
    """Cross-field rules (placement names a rack that does not exist) are beyond the CRD
    schema: the operator fails the job with the models' message and posts an event."""
    control_plane.kubectl("-n", namespace, "apply", "-f", "-", input=job_yaml(
        "k8-place", {"replicas": {"workers": 1}, "network": {"placement": {"ps-0": "nowhere"}}}))
    tj = _wait_job(control_plane, namespace, "k8-place", "Failed", operator)
    conditions = {c["type"]: c for c in tj["status"]["conditions"]}
    failed = conditions["Failed"]
    assert failed["reason"] == "InvalidSpec"
    # Nothing was created: Created is False, for that reason.
    assert (conditions["Created"]["status"], conditions["Created"]["reason"]) == (
        "False", "InvalidSpec")
    assert "spec.network.placement.ps-0" in failed["message"] and "nowhere" in failed["message"]
    events = operator_proc.wait_for(lambda: [
        e for e in operator_proc.get_json(control_plane, "-n", namespace, "get",
                                          "events")["items"]
        if e["involvedObject"]["name"] == "k8-place"], 30, "the event", operator)
    assert events[0]["reason"] == "InvalidSpec" and "nowhere" in events[0]["message"]
    assert not operator_proc.get_json(control_plane, "-n", namespace, "get", "pods")["items"]


@pytest.mark.parametrize("transport", ["tcp", "udp"])
def test_tcp_and_udp_jobs_with_background_load_are_admitted_in_a_restricted_namespace(
        control_plane, namespace, operator, transport):
    """Pod Security's restricted level, enforced by the API server: every pod of the
    job (PS, worker with a background sidecar, background pod) is admitted."""
    control_plane.kubectl("label", "namespace", namespace,
                          "pod-security.kubernetes.io/enforce=restricted")
    name = f"k8-rs-{transport}"
    control_plane.kubectl("-n", namespace, "apply", "-f", "-", input=job_yaml(
        name, {"replicas": {"workers": 1}, "transport": {"type": transport},
               "network": {"racks": [{"name": "rack-0"}, {"name": "rack-1"}]},
               "backgroundLoad": {"senders": ["rack-1"], "receivers": ["rack-0"],
                                  "target": {"requestsPerS": 5}, "durationS": 300}}))
    tj = _wait_job(control_plane, namespace, name, "Pending", operator)
    assert {c["type"]: c for c in tj["status"]["conditions"]}["Created"]["status"] == "True"
    pods = operator_proc.get_json(control_plane, "-n", namespace, "get", "pods")["items"]
    assert len(pods) >= 4 and all(p["metadata"]["name"].startswith(name) for p in pods), [
        p["metadata"]["name"] for p in pods]


def test_background_pods_are_stopped_when_the_job_ends(control_plane, namespace, operator):
    """Kept here, before the RBAC test: stopping them is the operator's one pod patch.
    More background tests: tests/k8s/test_operator_background.py."""
    control_plane.kubectl("-n", namespace, "apply", "-f", "-", input=job_yaml(
        "k8sbg-end", {"replicas": {"workers": 1},
                      "network": {"racks": [{"name": "rack-0"}, {"name": "rack-1"}]},
                      "backgroundLoad": {"senders": ["rack-1"], "receivers": ["rack-0"],
                                         "target": {"requestsPerS": 5}, "durationS": 300}}))
    _wait_job(control_plane, namespace, "k8sbg-end", "Pending", operator)
    for replica in ("ps-0", "bg-server-0", "bg-client-0"):   # play the kubelet
        _set_pod_phase(control_plane, namespace, f"k8sbg-end-{replica}", "Running")

    def deadlines():
        return {p["metadata"]["name"]: p["spec"].get("activeDeadlineSeconds")
                for p in operator_proc.get_json(control_plane, "-n", namespace, "get",
                                                "pods")["items"]}
    assert deadlines()["k8sbg-end-bg-client-0"] == 300 + 20 + 60   # while the job runs
    _set_pod_phase(control_plane, namespace, "k8sbg-end-worker-0", "Succeeded")
    _wait_job(control_plane, namespace, "k8sbg-end", "Succeeded", operator)
    ended = operator_proc.wait_for(
        lambda: (lambda d: d if d["k8sbg-end-bg-server-0"] == 1 else None)(deadlines()),
        30, "the background pods' deadlines to drop", operator)
    assert ended == {"k8sbg-end-ps-0": None, "k8sbg-end-worker-0": None,
                     "k8sbg-end-bg-server-0": 1, "k8sbg-end-bg-client-0": 1}


def test_a_bounded_loss_job_in_a_namespace_that_has_not_opted_in_fails_naming_the_label(
        control_plane, namespace, operator):
    """Kept before the RBAC test: reading the namespace's label is the operator's one
    namespaces get."""
    control_plane.kubectl("-n", namespace, "apply", "-f", "-", input=job_yaml(
        "k8-bl", {"replicas": {"workers": 1},
                  "transport": {"type": "bounded-loss", "p": 0.9}}))
    tj = _wait_job(control_plane, namespace, "k8-bl", "Failed", operator)
    conditions = {c["type"]: c for c in tj["status"]["conditions"]}
    assert conditions["Failed"]["reason"] == "BoundedLossNotAllowed"
    assert f"{resources.LABEL_NAMESPACE_XDP}=allowed" in conditions["Failed"]["message"]
    assert conditions["Created"]["status"] == "False"
    assert not operator_proc.get_json(control_plane, "-n", namespace, "get", "pods")["items"]
    operator_proc.wait_for(lambda: [
        e for e in operator_proc.get_json(control_plane, "-n", namespace, "get",
                                          "events")["items"]
        if e["involvedObject"]["name"] == "k8-bl"
        and e["reason"] == "BoundedLossNotAllowed" and e["type"] == "Warning"],
        30, "the Warning event", operator)


def test_a_create_the_api_server_keeps_refusing_fails_the_job_in_its_words(
        control_plane, namespace, operator):
    """An admission policy that admits no pod here (as a Gatekeeper or Kyverno rule, or a
    full quota, would refuse it): a few tries, each a Warning event, then Failed with the
    API server's message, not Pending for ever. (A ResourceQuota needs the
    controller-manager, which this API server runs without: tests/cluster has that.)"""
    policy = {"apiVersion": "admissionregistration.k8s.io/v1",
              "kind": "ValidatingAdmissionPolicy", "metadata": {"name": f"no-pods-{namespace}"},
              "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [{
                  "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                  "resources": ["pods"]}]},
                  "validations": [{"expression": "false",
                                   "message": "no pods in this namespace, by policy"}]}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1",
               "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": f"no-pods-{namespace}"},
               "spec": {"policyName": f"no-pods-{namespace}", "validationActions": ["Deny"],
                        "matchResources": {"namespaceSelector": {"matchLabels": {
                            "kubernetes.io/metadata.name": namespace}}}}}
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([policy, binding]))
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
             "spec": {"containers": [{"name": "c", "image": "x"}]}}
    operator_proc.wait_for(lambda: control_plane.kubectl(
        "-n", namespace, "create", "--dry-run=server", "-f", "-", input=json.dumps(probe),
        check=False).returncode != 0, 30, "the policy to take effect")
    control_plane.kubectl("-n", namespace, "apply", "-f", "-", input=job_yaml(
        "k8-quota", {"replicas": {"workers": 1}}))
    def failed():
        tj = operator_proc.get_json(control_plane, "-n", namespace, "get", "trainingjob",
                                    "k8-quota")
        return tj if (tj.get("status") or {}).get("phase") == "Failed" else None
    tj = operator_proc.wait_for(failed, 90, "the job to fail", operator)
    conditions = {c["type"]: c for c in tj["status"]["conditions"]}
    assert conditions["Failed"]["reason"] == "CreateFailed"
    message = conditions["Failed"]["message"]
    assert "no pods in this namespace, by policy" in message, message
    assert "tried 5 times" in message, message
    assert conditions["Created"]["status"] == "False"
    reasons = [e["reason"] for e in operator_proc.get_json(
        control_plane, "-n", namespace, "get", "events")["items"]
        if e["involvedObject"]["name"] == "k8-quota" and e["type"] == "Warning"]
    assert "CreateRetrying" in reasons and "CreateFailed" in reasons, reasons


def test_the_operator_watches_only_the_pods_of_jobs(control_plane, operator):
    """Its pod list and watch requests carry the job label's selector: the API server,
    not kopf, leaves out every other pod of the cluster."""
    pod_reads = [e for e in audit.requests_by(control_plane, OPERATOR_USER)
                 if e["objectRef"].get("resource") == "pods"
                 and e["verb"] in ("list", "watch")
                 and not e["objectRef"].get("namespace")]
    assert pod_reads, "no cluster-wide pod list or watch by the operator"
    for event in pod_reads:
        assert f"labelSelector={resources.LABEL_JOB}" in event["requestURI"].replace(
            "%2F", "/"), event["requestURI"]


def test_a_running_job_has_its_progress_read_from_the_ps_log(control_plane, namespace,
                                                             operator):
    """Kept before the RBAC test: the progress timer's log read is the operator's one
    pods/log request. With no kubelet here the API server cannot serve the log; the
    request is made all the same (the real-node test, tests/cluster, sees the epochs)."""
    control_plane.kubectl("-n", namespace, "apply", "-f", "-", input=job_yaml(
        "k8-progress", {"replicas": {"workers": 1}}))
    _wait_job(control_plane, namespace, "k8-progress", "Pending", operator)
    for replica in ("ps-0", "worker-0"):   # play the kubelet
        _set_pod_phase(control_plane, namespace, f"k8-progress-{replica}", "Running")
    _wait_job(control_plane, namespace, "k8-progress", "Running", operator)
    operator_proc.wait_for(lambda: [
        e for e in audit.requests_by(control_plane, OPERATOR_USER)
        if e["objectRef"].get("subresource") == "log"
        and e["objectRef"].get("name") == "k8-progress-ps-0"], 30,
        "the operator to read ps-0's log", operator)


def test_operator_rbac_lacks_nothing_and_grants_nothing_unused(control_plane, operator):
    """Runs after the reconcile tests above (same module, file order): every request
    the operator made is in its audit trail."""
    events = audit.requests_by(control_plane, OPERATOR_USER)
    assert events, "the operator made no requests as its service account"
    lacking = audit.denied(events)
    assert not lacking, f"the chart's ClusterRole lacks: {lacking}"
    unused = audit.granted(control_plane, "tailcut-operator") - audit.used(events)
    assert not unused, f"the chart's ClusterRole grants what the operator never used: {unused}"


@pytest.mark.parametrize("example", sorted((REPO / "examples").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_every_example_is_accepted_by_the_api_server(control_plane, namespace, example):
    """A server-side dry run: the CRD accepts what the models accept."""
    result = control_plane.kubectl("-n", namespace, "apply", "--dry-run=server", "-f",
                                   str(example), check=False)
    assert result.returncode == 0, result.stderr


def test_a_pod_that_saw_a_peer_go_away_waits_for_the_cause_then_fails_the_job_naming_it_first(
        control_plane, namespace, operator):
    """ps-0 exits with PEER_GONE (3) a moment before the worker that caused it (met in
    CI: the job failed naming only ps-0). Job "cause": its worker fails a moment later, and
    the Failed condition names the worker before ps-0. Job "alone": no other pod
    fails; the operator's timer fails it naming ps-0 once the grace is past."""
    jobs = ("k8-cause", "k8-alone")
    for name in jobs:
        control_plane.kubectl("-n", namespace, "apply", "-f", "-",
                              input=job_yaml(name, {"replicas": {"workers": 2}}))
    for name in jobs:
        _wait_job(control_plane, namespace, name, "Pending", operator)
        for replica in ("ps-0", "worker-0", "worker-1"):
            _set_pod_phase(control_plane, namespace, f"{name}-{replica}", "Running")
        _wait_job(control_plane, namespace, name, "Running", operator)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for name in jobs:
        _set_pod_phase(control_plane, namespace, f"{name}-ps-0", "Failed", exit_code=3,
                       message="10.2.0.3:34300 closed the connection", finished_at=now)

    def both_awaiting():
        found = [operator_proc.get_json(control_plane, "-n", namespace, "get",
                                        "trainingjob", n) for n in jobs]
        return found if all(
            {c["type"]: c for c in tj["status"]["conditions"]}["Running"]["reason"]
            == resources.REASON_AWAITING_CAUSE for tj in found) else None
    waiting = operator_proc.wait_for(both_awaiting, 30, "both jobs awaiting", operator)
    assert all(tj["status"]["phase"] == "Running" for tj in waiting), waiting
    _set_pod_phase(control_plane, namespace, "k8-cause-worker-1", "Failed", exit_code=1,
                   message="NoKernelHeaders: BCC found no headers under /usr/src")
    tj = _wait_job(control_plane, namespace, "k8-cause", "Failed", operator)
    message = {c["type"]: c for c in tj["status"]["conditions"]}["Failed"]["message"]
    assert message.index("k8-cause-worker-1") < message.index("k8-cause-ps-0"), message
    assert "NoKernelHeaders" in message
    started = time.monotonic()
    tj = _wait_job(control_plane, namespace, "k8-alone", "Failed", operator)
    message = {c["type"]: c for c in tj["status"]["conditions"]}["Failed"]["message"]
    assert "k8-alone-ps-0" in message and "closed the connection" in message, message
    assert "waiting" not in message, message
    assert time.monotonic() - started < resources.PEER_GONE_GRACE_S + 10
