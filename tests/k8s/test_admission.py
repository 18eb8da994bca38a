"""The node agent acts only for pods a TrainingJob controls, and builds only from that
TrainingJob: its spec and the placement the operator recorded in its status. Checked
on objects alone, then on what a real API server returns to the agent's own service
account for pods and config maps anyone could make."""

import json
import uuid
from types import SimpleNamespace

import pytest
import yaml

from tailcut import spec
from tailcut.k8s.agent import admission, daemon, podns
from tailcut.k8s.manifests import placement, resources
from tailcut.net import netns
from tests.k8s import operator_proc
from tests.k8s.conftest import agent_clients

NS = "k8-adm"
UID = "0a0a0a0a-1111-4222-8333-444444444444"
WHERE = {"a": placement.NodeAddress("node-a", "node-a", "192.0.2.1"),
         "b": placement.NodeAddress("node-b", "node-b", "192.0.2.2")}


def job(name="k8-adm", **job_spec):
    return spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                           "metadata": {"name": name}, "spec": job_spec})


TWO_RACKS = {"replicas": {"workers": 1}, "network": {
    "racks": [{"name": "a"}, {"name": "b"}], "placement": {"ps-0": "a", "worker-0": "b"}}}


def training_job(j, uid=UID, generation=1, recorded=1, where=None):
    status = {} if recorded is None else {"specGeneration": recorded,
                                          "placement": placement.to_status(where or {}),
                                          "overlayId": 77}
    return {"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": j.name, "namespace": NS, "uid": uid,
                         "generation": generation},
            "spec": j.model_dump(by_alias=True, mode="json")["spec"], "status": status}


def pod(name="k8-adm-ps-0", job_label="k8-adm", replica="ps-0", owner="k8-adm", uid=UID,
        kind="TrainingJob", api_version="tailcut.dev/v1alpha1", controller=True):
    refs = [] if owner is None else [SimpleNamespace(
        api_version=api_version, kind=kind, name=owner, uid=uid, controller=controller)]
    return SimpleNamespace(metadata=SimpleNamespace(
        namespace=NS, name=name, uid=str(uuid.uuid4()), owner_references=refs,
        labels={resources.LABEL_JOB: job_label, resources.LABEL_REPLICA: replica}))


def test_a_pod_its_training_job_controls_is_admitted_with_the_placement_of_its_status():
    two = job(**TWO_RACKS)
    ok = admission.admit(pod(), training_job(two, where=WHERE))
    assert (ok.job.name, ok.replica, ok.job_uid) == ("k8-adm", "ps-0", UID)
    assert ok.racks_at == WHERE and ok.overlay_id == 77
    assert len(ok.job.spec.network.racks) == 2


def test_in_network_programs_come_from_the_status_the_operator_resolved_them_into():
    aggregated = job(replicas={"workers": 2}, network={"inNetwork": {"multicast": True}})
    tj = training_job(aggregated)
    with pytest.raises(admission.Refused, match=r"not wired yet: .*status.inNetwork"):
        admission.admit(pod(), tj)   # the agent resolves nothing itself
    resolved = {"multicast": {"racks": [{"index": 0, "address": "10.1.0.252",
                                         "workers": [0, 1]}], "elements": 7}}
    tj["status"]["inNetwork"] = json.dumps(resolved)
    assert admission.admit(pod(), tj).tor == resolved
    tj["status"]["inNetwork"] = "{not json"
    with pytest.raises(admission.Refused, match="status.inNetwork .* is not JSON"):
        admission.admit(pod(), tj)
    assert admission.admit(pod(), training_job(job())).tor == {}


@pytest.mark.parametrize("the_pod, the_job, words", [
    (pod(owner=None), training_job(job()), "it has no controller"),
    (pod(controller=False), training_job(job()), "it has no controller"),
    (pod(kind="ReplicaSet", api_version="apps/v1"), training_job(job()),
     "its controller is ReplicaSet k8-adm (apps/v1), not a TrainingJob"),
    (pod(api_version="evil.example/v1alpha1"), training_job(job()), "not a TrainingJob"),
    (pod(), None, "its controller, TrainingJob k8-adm/k8-adm, does not exist"),
    (pod(uid="another-uid"), training_job(job()),
     f"has uid {UID}, not another-uid as the pod's controller reference says"),
    (pod(job_label="k8-other"), training_job(job()),
     "label tailcut.dev/job='k8-other' does not name its controller k8-adm"),
    (pod(), training_job(job(), recorded=None), "the operator has not recorded"),
    (pod(), training_job(job(), generation=2),
     "spec changed (generation 2) after its pods were made from generation 1"),
    (pod(replica="worker-7"), training_job(job()),
     "label tailcut.dev/replica='worker-7' names no pod of job k8-adm"),
    (pod(name="k8-adm-evil"), training_job(job()),
     "the operator names ps-0 of job k8-adm k8-adm-ps-0"),
], ids=["no-owner", "owner-not-controller", "replicaset", "other-group", "no-job",
        "other-uid", "other-job-label", "not-recorded", "spec-changed", "no-such-replica",
        "other-name"])
def test_every_other_pod_is_refused_naming_why(the_pod, the_job, words):
    with pytest.raises(admission.Refused, match=words.replace("(", r"\(").replace(")", r"\)")):
        admission.admit(the_pod, the_job)


# --- against a real API server, as the agent's service account ---

def bare_pod(name, job_name, replica, node, owner=None):
    meta = {"name": name, "labels": resources.labels(job(job_name), "ps", replica, "a"),
            # what the agent used to read the spec from: anyone can write it
            "annotations": {"tailcut.dev/spec-configmap": f"{job_name}-spec"}}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}}


@pytest.mark.k8s
def test_pods_and_config_maps_made_without_a_training_job_get_nothing_from_the_agent(
        control_plane, release, namespace):
    cp, node = control_plane, f"k8-adm-node-{namespace}"
    # A real job, its status recorded as the operator records it: the positive control.
    real = job("k8-adm-real", **TWO_RACKS)
    cp.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(
        {"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
         "metadata": {"name": real.name}, "spec": TWO_RACKS}))
    tj = operator_proc.get_json(cp, "-n", namespace, "get", "trainingjob", real.name)
    cp.kubectl("-n", namespace, "patch", "trainingjob", real.name, "--subresource=status",
               "--type=merge", "-p", json.dumps({"status": {
                   "specGeneration": tj["metadata"]["generation"],
                   "placement": placement.to_status(WHERE), "overlayId": 77}}))
    owner = resources.owner_reference(tj)
    # What anyone who may create pods and config maps could make: the job's labels,
    # config maps of the operator's names, one saying the racks are at an address of
    # their choosing, and pods that claim jobs.
    hostile = {"spec.yaml": yaml.safe_dump(job("k8-adm-forged").model_dump(
        by_alias=True, mode="json")), "placement.json": json.dumps(
        {"rack-0": {"node": node, "hostname": node, "ip": "203.0.113.9"}})}
    ghost = {**owner, "name": "k8-adm-ghost", "uid": str(uuid.uuid4())}
    objects = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "k8-adm-forged-spec"},
         "data": hostile},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "k8-adm-real-spec"},
         "data": hostile},
        bare_pod("k8-adm-forged-ps-0", "k8-adm-forged", "ps-0", node),
        bare_pod("k8-adm-ghost-ps-0", "k8-adm-ghost", "ps-0", node, ghost),
        bare_pod("k8-adm-stale-ps-0", "k8-adm-real", "ps-0", node,
                 {**owner, "uid": str(uuid.uuid4())}),
        bare_pod("k8-adm-evil", "k8-adm-real", "ps-0", node, owner),
    ]
    real_pod = next(p for p in resources.pods(real, owner, "x")
                    if p["metadata"]["name"] == "k8-adm-real-ps-0")
    real_pod["spec"]["nodeName"] = node
    cp.kubectl("-n", namespace, "apply", "-f", "-",
               input=yaml.safe_dump_all(objects + [real_pod]))
    for name in ("k8-adm-forged-ps-0", "k8-adm-ghost-ps-0", "k8-adm-stale-ps-0",
                 "k8-adm-evil", "k8-adm-real-ps-0"):
        cp.kubectl("-n", namespace, "patch", "pod", name, "--subresource=status",
                   "--type=merge", "-p", json.dumps({"status": {"phase": "Running"}}))

    core, jobs = agent_clients(cp, release, "agent-admission")
    node_agent = daemon.Agent(core, jobs, node=node)
    events = node_agent.events()
    seen = {p.metadata.name: p for _, p in (next(events) for _ in range(5))}
    events.close()   # before its watch starts: the list is what the agent acts on
    expected = {
        "k8-adm-forged-ps-0": "it has no controller",
        "k8-adm-ghost-ps-0": f"TrainingJob {namespace}/k8-adm-ghost, does not exist",
        "k8-adm-stale-ps-0": "not .* as the pod's controller reference says",
        "k8-adm-evil": "the operator names ps-0 of job k8-adm-real k8-adm-real-ps-0",
    }
    for name, words in expected.items():
        with pytest.raises(admission.Refused, match=words):
            node_agent.handle("ADDED", seen[name])
    assert not node_agent.wired and not node_agent.fabrics
    assert netns.list_names(podns.PREFIX + namespace) == [], "nothing was built"

    ok = node_agent.admit(seen["k8-adm-real-ps-0"])
    assert (ok.job.name, ok.replica, ok.job_uid) == ("k8-adm-real", "ps-0",
                                                     tj["metadata"]["uid"])
    assert ok.racks_at == WHERE, "the placement comes from the job's status, not a config map"
    assert [r.name for r in ok.job.spec.network.racks] == ["a", "b"]
