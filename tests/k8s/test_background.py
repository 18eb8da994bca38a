"""The background load's manifests (tailcut.k8s.manifests.background), without an API server."""

import json

import pytest

from tailcut import spec
from tailcut.errors import SpecError
from tailcut.k8s.manifests import background, resources
from tailcut.net import topology

OWNER = {"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob", "name": "k8sbg-u",
         "uid": "1234", "controller": True, "blockOwnerDeletion": True}


def job(load, workers=2):
    return spec.from_dict({
        "apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": "k8sbg-u"},
        "spec": {"replicas": {"workers": workers},
                 "network": {"racks": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
                             "placement": {"ps-0": "a", "worker-0": "b", "worker-1": "c"}},
                 "backgroundLoad": load}})


def names(containers):
    return [(c["name"], c["args"][0], c["args"][c["args"].index("--mode") + 1]
             if "--mode" in c["args"] else None) for c in containers]


def test_a_job_without_background_load_gets_nothing_extra():
    j = spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                        "metadata": {"name": "k8sbg-u"}, "spec": {}})
    assert background.plan(j) is None
    pods = resources.pods(j, OWNER, "img")
    assert background.with_sidecars(j, None, pods, "img") == resources.pods(j, OWNER, "img")


def test_each_sending_rack_gets_a_server_pod_and_each_receiving_rack_a_locust_pod():
    j = job({"senders": ["b", "c"], "receivers": ["a"], "target": {"requestsPerS": 10},
             "durationS": 40})
    p = background.plan(j)
    pods = background.pods(j, p, OWNER, "img")
    assert [(q["metadata"]["name"], q["metadata"]["labels"][resources.LABEL_RACK])
            for q in pods] == [("k8sbg-u-bg-client-0", "a"), ("k8sbg-u-bg-server-0", "b"),
                               ("k8sbg-u-bg-server-1", "c")]
    client = pods[0]
    assert names(client["spec"]["containers"]) == [("locust", "locust", "standalone")]
    assert names(pods[1]["spec"]["containers"]) == [("bg-server", "server", None)]
    for q in pods:
        assert q["metadata"]["ownerReferences"] == [OWNER]
        assert q["spec"]["activeDeadlineSeconds"] == 40 + 20 + background.DEADLINE_MARGIN_S
        rack = q["metadata"]["labels"][resources.LABEL_RACK]
        assert {k: q["spec"][k] for k in ("affinity",)} == resources.rack_scheduling(j, rack)
        assert "--stay" not in q["spec"]["containers"][0]["args"]
    # Servers are reached at their addresses on the job's links, as under tailcut run.
    config = json.loads(background.config_map(j, p, OWNER)["data"][background.CONFIG_KEY])
    topo = topology.plan(j)
    assert config["servers"] == [f"http://{topo.pod('bg-server-0').ip}:8080",
                                 f"http://{topo.pod('bg-server-1').ip}:8080"]
    assert all(c["args"][-2:] == ["--ifname", "tc0"]
               for q in pods for c in q["spec"]["containers"])
    assert config["clients"] == 1 and config["server_duration_s"] == 60


def test_several_receivers_get_a_master_in_the_first_and_a_worker_in_each():
    j = job({"senders": ["a"], "receivers": ["b", "worker-1"],
             "target": {"link": "uplink/a", "loadFactor": 0.3}})
    p = background.plan(j)
    (client,) = [q for q in background.pods(j, p, OWNER, "img")
                 if q["metadata"]["labels"][resources.LABEL_ROLE] == "bg-client"]
    assert names(client["spec"]["containers"]) == [
        ("locust-master", "locust", "master"), ("locust", "locust", "worker")]
    pods = {q["metadata"]["labels"][resources.LABEL_REPLICA]: q for q in
            background.with_sidecars(j, p, resources.pods(j, OWNER, "img"), "img")}
    (sidecar,) = pods["worker-1"]["spec"]["initContainers"]
    assert names([sidecar]) == [("locust", "locust", "worker")]
    assert sidecar["restartPolicy"] == "Always" and sidecar["args"][-1] == "--stay"
    assert {v["name"] for v in pods["worker-1"]["spec"]["volumes"]} == {
        "spec", "background", "background-results"}
    assert "initContainers" not in pods["ps-0"]["spec"]
    status = background.status(j, p, "lab")
    assert status["clients"] == ["k8sbg-u-bg-client-0", "k8sbg-u-worker-1"]
    assert status["locustStats"].startswith(
        "kubectl -n lab logs k8sbg-u-bg-client-0 -c locust-master")


def test_a_rate_locust_cannot_drive_is_a_spec_error_naming_the_field():
    j = job({"senders": ["worker-0"], "receivers": ["ps-0"],
             "target": {"link": "access/ps-0", "loadFactor": 1.0},
             "flowSizes": {"distribution": "fixed", "bytes": 100}})
    with pytest.raises(SpecError, match=r"spec\.backgroundLoad\.target"):
        background.check(j)


def test_the_summary_counts_background_pods_and_sums_the_servers_reports_once_all_came():
    def server(name, phase, sent=None, sidecar=False, role="bg-server"):
        cs = [{"name": "bg-server", "state": {"terminated": {"message": json.dumps(
            {"sent": sent})}} if sent else {"running": {}}}]
        key = "initContainers" if sidecar else "containers"
        return {"metadata": {"name": name, "annotations": {background.ANNOTATION: "bg-server"},
                             "labels": {resources.LABEL_ROLE: role}},
                "spec": {key: [{"name": "bg-server"}]},
                "status": {"phase": phase,
                           ("initContainerStatuses" if sidecar else "containerStatuses"): cs}}
    plain = {"metadata": {"name": "ps", "labels": {resources.LABEL_ROLE: "ps"}},
             "spec": {"containers": [{"name": "ps"}]}, "status": {"phase": "Running"}}
    half = [server("a", "Succeeded", {"load_factor_of_target_link": 0.2, "mbit_per_s": 200}),
            server("w", "Running", sidecar=True, role="worker"), plain]
    assert background.pods_summary(half) == {
        "pods": {"active": 0, "succeeded": 1, "failed": 0}, "serversReported": 1}
    done = half[:1] + [server("w", "Succeeded", {"load_factor_of_target_link": 0.1,
                                                 "mbit_per_s": 100}, sidecar=True,
                              role="worker"), plain]
    summary = background.pods_summary(done)
    assert summary["sentLoadFactor"] == pytest.approx(0.3)
    assert summary["sentMbitPerS"] == pytest.approx(300)
    # A message that is not a report (a crash's last log lines) counts as no report.
    crashed = [server("a", "Failed", None)]
    crashed[0]["status"]["containerStatuses"][0]["state"] = {
        "terminated": {"message": "Traceback ..."}}
    assert background.pods_summary(crashed) == {
        "pods": {"active": 0, "succeeded": 0, "failed": 1}, "serversReported": 0}
