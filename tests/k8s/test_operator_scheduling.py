"""spec.scheduling through the operator, against the real kube-apiserver: a cadentflow
job's config map carries the scheduling section and the per-tensor tags the pods read
(mounted next to the spec), and a scheduling section the Kubernetes path cannot honour
fails the job naming the field, with no pod, service or config map created."""

import importlib.util
import json

import pytest
import yaml

from tailcut import spec
from tailcut.k8s.manifests import policy, resources
from tailcut.scheduling import flowreport
from tests.k8s import operator_proc
from tests.k8s.conftest import REPO, operator_kubeconfig

pytestmark = pytest.mark.k8s


@pytest.fixture(scope="module")
def operator(control_plane, release, tmp_path_factory):
    """The operator as the chart's service account, watching every namespace."""
    log = tmp_path_factory.mktemp("ks-operator") / "operator.log"
    proc = operator_proc.start(operator_kubeconfig(control_plane, release, "ks-operator"), log)
    try:
        yield log
    finally:
        operator_proc.stop(proc)


def apply(cp, namespace, name, spec):
    cp.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(
        {"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
         "metadata": {"name": name}, "spec": spec}))


def wait_phase(cp, namespace, name, phase, log):
    def check():
        tj = operator_proc.get_json(cp, "-n", namespace, "get", "trainingjob", name)
        return tj if (tj.get("status") or {}).get("phase") == phase else None
    return operator_proc.wait_for(check, 60, f"{namespace}/{name} to be {phase}", log)


def test_a_cadentflow_jobs_pods_get_the_scheduling_section_and_their_tags(
        control_plane, namespace, operator, tmp_path):
    apply(control_plane, namespace, "ks-cf", {
        "replicas": {"workers": 2}, "training": {"model": "deep-mlp"},
        "scheduling": {"policy": "cadentflow", "priorityLevels": 3,
                       "flows": [{"layer": "fc4.weight", "direction": "pull",
                                  "priority": 0}]}})
    wait_phase(control_plane, namespace, "ks-cf", "Pending", operator)
    cm = operator_proc.get_json(control_plane, "-n", namespace, "get", "configmap",
                                "ks-cf-spec")
    scheduling = yaml.safe_load(cm["data"][resources.SPEC_KEY])["spec"]["scheduling"]
    assert scheduling["policy"] == "cadentflow" and scheduling["priorityLevels"] == 3
    flows = json.loads(cm["data"][policy.FLOWS_KEY])
    assert flows["policy"] == "cadentflow"
    assert flows["pull"]["fc1.weight"] == 0 and flows["pull"]["fc4.weight"] == 0
    assert flows["push"]["fc4.weight"] != 0, "the hand-written tag is for the pull only"
    local = flowreport.role_flows(spec.load_text(cm["data"][resources.SPEC_KEY]))
    assert flows == local, "the same tags `tailcut run` gives its roles"

    pods = operator_proc.get_json(control_plane, "-n", namespace, "get", "pods", "-l",
                                  f"{resources.LABEL_JOB}=ks-cf")["items"]
    assert len(pods) == 3
    for pod in pods:   # the config map, with both keys, at /etc/tailcut in every pod
        (mount,) = pod["spec"]["containers"][0]["volumeMounts"]
        (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
        assert mount["mountPath"] == resources.SPEC_MOUNT
        assert volume["configMap"]["name"] == "ks-cf-spec" and "items" not in volume["configMap"]

    # What a pod's entrypoint makes of that mount: its role config with the tags.
    for key, text in cm["data"].items():
        (tmp_path / key).write_text(text)
    loaded = importlib.util.spec_from_file_location("entrypoint",
                                                    REPO / "workers" / "entrypoint.py")
    entry = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(entry)
    job = spec.load_file(tmp_path / resources.SPEC_KEY)
    for replica in ("ps-0", "worker-1"):
        config = entry.role_config(job, replica, str(tmp_path),
                                   entry.read_flows(tmp_path / resources.SPEC_KEY))
        assert config.flows == flows


@pytest.mark.parametrize("name,scheduling,extra,words", [
    ("ks-coflow", {"policy": "coflow"}, {"transport": {"type": "app-drop", "p": 0.9}},
     "spec.scheduling.policy='coflow' with spec.transport.type='app-drop'"),
    ("ks-appdrop", {"policy": "cadentflow"}, {"transport": {"type": "app-drop", "p": 0.9}},
     "spec.scheduling.policy='cadentflow' with spec.transport.type='app-drop'"),
    ("ks-replica", {"policy": "cadentflow"}, {"replicas": {"workers": 1, "psReplica": True}},
     "spec.scheduling.policy='cadentflow' with spec.replicas.aggregators or "
     "spec.replicas.psReplica"),
    ("ks-tensor", {"policy": "cadentflow", "flows": [{"layer": "conv9", "priority": 0}]},
     {}, "spec.scheduling.flows[0].layer='conv9'"),
])
def test_a_scheduling_section_the_cluster_cannot_honour_creates_nothing(
        control_plane, namespace, operator, name, scheduling, extra, words):
    apply(control_plane, namespace, name, {"replicas": {"workers": 1},
                                           "scheduling": scheduling, **extra})
    # (extra may replace replicas)
    tj = wait_phase(control_plane, namespace, name, "Failed", operator)
    failed = {c["type"]: c for c in tj["status"]["conditions"]}["Failed"]
    assert failed["reason"] == "InvalidSpec" and words in failed["message"], failed
    for kind in ("pods", "services", "configmaps"):
        items = operator_proc.get_json(control_plane, "-n", namespace, "get", kind)["items"]
        ours = [i["metadata"]["name"] for i in items if i["metadata"]["name"].startswith(name)]
        assert not ours, f"{kind} created for a refused job: {ours}"


AGREEMENT = [(p.stem, yaml.safe_load(p.read_text())["spec"])
             for p in sorted((REPO / "examples").glob("*.yaml"))] + [
    ("bad-background", {"replicas": {"workers": 1},
                        "network": {"racks": [{"name": "rack-0"}, {"name": "rack-1"}]},
                        "backgroundLoad": {
                            "senders": ["rack-1"], "receivers": ["ps-0"],
                            "target": {"link": "uplink/rack-1", "loadFactor": 0.9},
                            "flowSizes": {"distribution": "fixed", "bytes": 1}}}),
    # past the chart's default limit on a link end's queue memory (k8s/manifests/limits)
    ("deep-buffer", {"replicas": {"workers": 1},
                     "network": {"accessLink": {"bandwidth": "1Gbit"},
                                 "uplink": {"bandwidth": "8kbit", "bufferBytes": 1_000_000_000}}}),
    ("bad-tag", {"replicas": {"workers": 1}, "scheduling": {
        "policy": "cadentflow", "flows": [{"layer": "conv9", "priority": 0}]}}),
]


@pytest.mark.parametrize("name,job_spec", AGREEMENT, ids=[a[0] for a in AGREEMENT])
def test_tailcut_validate_and_the_operator_accept_and_refuse_the_same_specs(
        control_plane, namespace, operator, tmp_path, capsys, name, job_spec):
    """`tailcut validate --executor kubernetes` of a file and the operator given the
    same spec: both accept it (the operator creates its pods) or both refuse it with
    the same words (the operator creating nothing)."""
    from tailcut import cli

    job_name = f"ag-{name}"[:40]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "tailcut.dev/v1alpha1",
                                    "kind": "TrainingJob", "metadata": {"name": job_name},
                                    "spec": job_spec}))
    validated = cli.main(["validate", "--executor", "kubernetes", str(path)])
    refusal = capsys.readouterr().err.strip().removeprefix(f"tailcut: {path}: ")
    if (job_spec.get("transport") or {}).get("type") == "bounded-loss":
        # A cluster admin's opt-in for its pods' privileges (docs/kubernetes.md).
        control_plane.kubectl("label", "namespace", namespace,
                              "tailcut.dev/bounded-loss=allowed")
    apply(control_plane, namespace, job_name, job_spec)
    if validated == 0:
        tj = wait_phase(control_plane, namespace, job_name, "Pending", operator)
        assert tj["status"]["conditions"][0]["reason"] == "TrainingJobCreated"
        return
    tj = wait_phase(control_plane, namespace, job_name, "Failed", operator)
    failed = {c["type"]: c for c in tj["status"]["conditions"]}["Failed"]
    assert failed["reason"] == ("KernelLimitExceeded" if name == "deep-buffer" else "InvalidSpec")
    assert refusal and refusal in failed["message"], (refusal, failed["message"])


def test_the_operator_imports_no_tenants_module(control_plane, namespace, operator, tmp_path):
    """A job naming a module the operator could import (a file on its own host here):
    a plain job's pods are made without importing it, and a CadentFlow job, whose
    schedule would need the model built, is refused naming the module. The module
    leaves a marker if anything imports it."""
    marker = tmp_path / "imported"
    tenant = tmp_path / "tenant.py"
    tenant.write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                      "def build(seed):\n    raise SystemExit(1)\n")
    training = {"model": "torch", "module": f"{tenant}:build"}
    apply(control_plane, namespace, "ks-mod", {"replicas": {"workers": 1},
                                               "training": training})
    wait_phase(control_plane, namespace, "ks-mod", "Pending", operator)
    apply(control_plane, namespace, "ks-mod-cf", {
        "replicas": {"workers": 1}, "training": training,
        "scheduling": {"policy": "cadentflow", "priorityLevels": 2}})
    tj = wait_phase(control_plane, namespace, "ks-mod-cf", "Failed", operator)
    failed = {c["type"]: c for c in tj["status"]["conditions"]}["Failed"]
    assert "imports no tenant's module" in failed["message"], failed
    assert not marker.exists(), "the operator imported the tenant's module"
