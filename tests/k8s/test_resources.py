"""Manifests the operator creates for a job, and the status it reads back from pods."""

import json
from datetime import datetime, timedelta, timezone

from tailcut import spec
from tailcut.k8s.manifests import resources, status

OWNER = {"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob", "name": "k8-demo",
         "uid": "1234", "controller": True, "blockOwnerDeletion": True}


def job(workers=2):
    return spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                           "metadata": {"name": "k8-demo"},
                           "spec": {"replicas": {"workers": workers},
                                    "network": {"racks": [{"name": "a"}, {"name": "b"}]}}})


def pod(replica, phase, exit_code=None):
    p = {"metadata": {"name": f"k8-demo-{replica}",
                      "labels": {resources.LABEL_REPLICA: replica}},
         "status": {"phase": phase}}
    if exit_code is not None:
        p["status"]["containerStatuses"] = [{"name": "worker", "state": {"terminated": {
            "exitCode": exit_code, "reason": "Error", "message": "boom"}}}]
    return p


def test_one_pod_per_replica_owned_by_the_job_with_role_and_rack_labels():
    pods = resources.pods(job(), OWNER, "img:1")
    assert [p["metadata"]["name"] for p in pods] == ["k8-demo-ps-0", "k8-demo-worker-0",
                                                     "k8-demo-worker-1"]
    for p in pods:
        assert p["metadata"]["ownerReferences"] == [OWNER]
        assert p["metadata"]["labels"][resources.LABEL_JOB] == "k8-demo"
        assert p["spec"]["subdomain"] == "k8-demo"
        assert p["spec"]["automountServiceAccountToken"] is False
    assert [p["metadata"]["labels"][resources.LABEL_RACK] for p in pods] == ["a", "a", "b"]


def test_service_is_headless_and_selects_the_jobs_pods():
    svc = resources.service(job(), OWNER)
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {resources.LABEL_JOB: "k8-demo"}


def test_config_map_holds_the_spec_with_defaults_filled_in():
    cm = resources.config_map(job(), OWNER)
    again = spec.load_text(cm["data"][resources.SPEC_KEY])
    assert again == job()


def test_job_is_pending_until_every_pod_runs():
    phase, counts, reason, _ = resources.status_from_pods(
        job(), [pod("ps-0", "Running"), pod("worker-0", "Running"), pod("worker-1", "Pending")])
    assert (phase, reason) == ("Pending", "PodsPending")
    assert counts["Worker"]["active"] == 2


def test_job_runs_when_all_pods_run_and_succeeds_when_workers_succeed():
    running = [pod("ps-0", "Running"), pod("worker-0", "Running"), pod("worker-1", "Running")]
    assert resources.status_from_pods(job(), running)[0] == "Running"
    done = [pod("ps-0", "Running"), pod("worker-0", "Succeeded"), pod("worker-1", "Succeeded")]
    assert resources.status_from_pods(job(), done)[0] == "Succeeded"


def test_a_failed_pod_fails_the_job_and_is_named_with_its_exit_code():
    phase, counts, reason, message = resources.status_from_pods(
        job(), [pod("ps-0", "Running"), pod("worker-0", "Running"),
                pod("worker-1", "Failed", exit_code=1)])
    assert (phase, reason) == ("Failed", "PodFailed")
    assert "k8-demo-worker-1: container worker exited with code 1 (boom)" in message
    assert counts["Worker"]["failed"] == 1


def ended_at(p, when):
    p["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = when
    return p


def test_a_pod_that_saw_a_peer_go_away_waits_for_the_peer_to_be_named_first():
    """ps-0 exits with PEER_GONE (3) a moment before the worker whose failure it saw
    (met in CI: the job failed naming only ps-0). The job waits up to
    PEER_GONE_GRACE_S for the cause, then names it before its victim; with no cause
    by then, it fails naming the victim."""
    t0 = datetime(2026, 11, 26, 12, 0, 0, tzinfo=timezone.utc)
    victim = ended_at(pod("ps-0", "Failed", exit_code=3), "2026-11-26T12:00:00Z")
    alive = [pod("worker-0", "Running"), pod("worker-1", "Running")]
    phase, counts, reason, message = resources.status_from_pods(
        job(), [victim, *alive], now=t0 + timedelta(seconds=2))
    assert (phase, reason) == ("Running", resources.REASON_AWAITING_CAUSE), message
    assert message.startswith("k8-demo-ps-0: container worker exited with code 3")
    assert counts["PS"]["failed"] == 1
    cause = pod("worker-1", "Failed", exit_code=1)
    phase, _, reason, message = resources.status_from_pods(
        job(), [victim, alive[0], cause], now=t0 + timedelta(seconds=3))
    assert (phase, reason) == ("Failed", "PodFailed")
    assert message.index("k8-demo-worker-1") < message.index("k8-demo-ps-0"), message
    late = t0 + timedelta(seconds=resources.PEER_GONE_GRACE_S + 1)
    phase, _, reason, message = resources.status_from_pods(job(), [victim, *alive], now=late)
    assert (phase, reason) == ("Failed", "PodFailed")
    assert "k8-demo-ps-0: container worker exited with code 3" in message


def test_victims_fail_the_job_at_once_when_no_pod_is_left_to_be_the_cause():
    victims = [ended_at(pod(r, "Failed", exit_code=3), "2026-11-26T12:00:00Z")
               for r in ("ps-0", "worker-0")]
    now = datetime(2026, 11, 26, 12, 0, 1, tzinfo=timezone.utc)
    assert resources.status_from_pods(job(1), victims, now=now)[:3:2] == (
        "Failed", "PodFailed")
    # An exit without a time the API server gave waits for no one either.
    bare = pod("worker-1", "Failed", exit_code=3)
    assert resources.status_from_pods(
        job(), [pod("ps-0", "Running"), pod("worker-0", "Running"), bare])[0] == "Failed"


def test_a_pod_its_node_cannot_carry_fails_the_job_at_once_with_the_agents_words():
    """Its agent will never wire it (tailcut.k8s.agent.errors.NodeUnfit): not Pending until
    the pod gives up waiting for tc0."""
    unfit = pod("worker-1", "Running")
    unfit["metadata"]["annotations"] = {
        resources.ANNOTATION_NODE_UNFIT: "node n: NodeUnfit: spec.network.mtu is 1500 ..."}
    phase, counts, reason, message = resources.status_from_pods(
        job(), [pod("ps-0", "Running"), pod("worker-0", "Running"), unfit])
    assert (phase, reason) == ("Failed", "NodeUnfit")
    assert message == "k8-demo-worker-1: node n: NodeUnfit: spec.network.mtu is 1500 ..."
    assert counts["Worker"] == {"active": 1, "succeeded": 0, "failed": 1}
    # Once the pod has ended, its own exit speaks for it.
    unfit["status"] = {"phase": "Failed"}
    assert resources.status_from_pods(job(), [unfit])[2] == "PodFailed"


def test_a_pod_its_agent_refused_for_good_fails_the_job_at_once_with_the_agents_words():
    refused = pod("worker-1", "Running")
    refused["metadata"]["annotations"] = {
        resources.ANNOTATION_WIRING_ERROR: "node n: lab/k8-demo-worker-1: not wired: ...",
        resources.ANNOTATION_REFUSED: "node n: lab/k8-demo-worker-1: not wired: ..."}
    phase, counts, reason, message = resources.status_from_pods(
        job(), [pod("ps-0", "Running"), pod("worker-0", "Running"), refused])
    assert (phase, reason) == ("Failed", "AgentRefused")
    assert message == "k8-demo-worker-1: node n: lab/k8-demo-worker-1: not wired: ..."
    assert counts["Worker"] == {"active": 1, "succeeded": 0, "failed": 1}


def test_pods_of_one_rack_prefer_one_node_and_racks_prefer_different_nodes():
    ps, w0, w1 = resources.pods(job(), OWNER, "img:1")
    same = ps["spec"]["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    terms = same[0]["podAffinityTerm"]["labelSelector"]["matchExpressions"]
    assert {"key": resources.LABEL_RACK, "operator": "In", "values": ["a"]} in terms
    assert same[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    apart = w1["spec"]["affinity"]["podAntiAffinity"]
    rule = apart["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert {"key": resources.LABEL_RACK, "operator": "NotIn", "values": ["b"]} in (
        rule["labelSelector"]["matchExpressions"])


def test_roles_other_than_ps_and_worker_keep_their_own_name():
    assert resources.role_of("bg-client-0") == "bg-client"
    assert resources.role_key("bg-client") == "bg-client"
    assert resources.role_key("worker") == "Worker"


def test_config_map_carries_the_per_tensor_tags_of_a_cadentflow_job():
    import json

    from tailcut.k8s.manifests import policy

    cf = spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                         "metadata": {"name": "ks-demo"},
                         "spec": {"training": {"model": "deep-mlp"},
                                  "scheduling": {"policy": "cadentflow"}}})
    data = resources.config_map(cf, OWNER)["data"]
    assert spec.load_text(data[resources.SPEC_KEY]).spec.scheduling.policy == "cadentflow"
    flows = json.loads(data[policy.FLOWS_KEY])
    assert flows["policy"] == "cadentflow" and flows["pull"]["fc1.weight"] == 0
    assert json.loads(resources.config_map(job(), OWNER)["data"][policy.FLOWS_KEY]) == {
        "policy": "fair"}


def replicated():
    return spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                           "metadata": {"name": "k8-demo"},
                           "spec": {"replicas": {"workers": 1, "psReplica": True}}})


def test_with_a_replica_losing_ps_0_neither_fails_nor_stalls_the_job():
    """ps-0 deleted (its pod gone) or failed: the replica takes over, as under
    `tailcut run`; the job still runs, and succeeds with its workers."""
    for ps in ([], [pod("ps-0", "Failed", exit_code=137)]):
        phase, counts, reason, message = resources.status_from_pods(
            replicated(), ps + [pod("replica-0", "Running"), pod("worker-0", "Running")])
        assert (phase, reason) == ("Running", "AllPodsRunning"), message
        assert "ps-0 lost; replica-0 serves" in message
        done = ps + [pod("replica-0", "Succeeded"), pod("worker-0", "Succeeded")]
        assert resources.status_from_pods(replicated(), done)[0] == "Succeeded"


def test_without_a_replica_a_failed_ps_fails_the_job_and_both_lost_fail_it_too():
    failed = [pod("ps-0", "Failed", exit_code=137), pod("worker-0", "Running"),
              pod("worker-1", "Running")]
    assert resources.status_from_pods(job(), failed)[0] == "Failed"
    both = [pod("ps-0", "Failed", exit_code=137), pod("replica-0", "Failed", exit_code=1),
            pod("worker-0", "Running")]
    phase, _, _, message = resources.status_from_pods(replicated(), both)
    assert phase == "Failed" and "replica-0" in message


def terminated(replica, message):
    p = pod(replica, "Succeeded")
    p["status"]["containerStatuses"] = [{"name": "ps", "state": {"terminated": {
        "exitCode": 0, "message": message}}}]
    return p


DONE = ('{"jct_s": 4.2, "epochs": 7, "iterations": 700, "final_accuracy": 0.931, '
        '"final_loss": 0.2, "converged": true}')


def test_the_figures_come_from_ps_0_or_else_from_the_replica_that_finished():
    from_ps = resources.figures_from_pods(replicated(), [terminated("ps-0", DONE)])
    assert from_ps["jctSeconds"] == 4.2 and from_ps["accuracy"] == 0.931
    taken_over = DONE.replace("4.2", "5.5")
    assert resources.figures_from_pods(
        replicated(), [terminated("replica-0", taken_over)])["jctSeconds"] == 5.5
    # ps-0 killed: its message is the end of its log, not the PS's JSON.
    assert resources.figures_from_pods(
        replicated(), [terminated("ps-0", "Killed"),
                       terminated("replica-0", taken_over)])["jctSeconds"] == 5.5
    assert resources.figures_from_pods(replicated(), [pod("ps-0", "Running")]) == {}


def test_the_status_carries_the_verdict_from_the_leaders_node():
    assert "fidelity" not in resources.figures_from_pods(replicated(),
                                                         [terminated("ps-0", DONE)])
    busy = DONE[:-1] + (', "host": {"wall_s": 4.2, "cores": 2, "busy": 0.97, '
                        '"softirq": 0.1, "steal": 0.0, "psi_some": 0.8, "load1": 4.0}}')
    fidelity = resources.figures_from_pods(replicated(), [terminated("ps-0", busy)])[
        "fidelity"]
    assert fidelity["verdict"] == "host-bound"
    assert fidelity["reasons"][0].startswith("the host's 2 cores were 97% busy")
    assert any("links' rates were not sampled" in note for note in fidelity["notes"])
    status.Status.model_validate({"fidelity": fidelity})   # the CRD's shape


def test_only_bounded_loss_pods_get_the_capabilities_of_the_xdp_counter():
    """tcp pods: non-root, every capability dropped, no host path. bounded-loss pods:
    root in the container with only BPF, NET_ADMIN and PERFMON, and the kernel headers
    read-only (the role compiles and attaches its counter itself)."""
    plain = resources.pods(job(), OWNER, "img:1")[0]["spec"]
    sc = plain["containers"][0]["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    assert [v["name"] for v in plain["volumes"]] == ["spec"]
    bl = spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                         "metadata": {"name": "k8-demo"},
                         "spec": {"transport": {"type": "bounded-loss", "p": 0.9}}})
    for pod_spec in (p["spec"] for p in resources.pods(bl, OWNER, "img:1")):
        container = pod_spec["containers"][0]
        sc = container["securityContext"]
        assert sc["capabilities"] == {"drop": ["ALL"], "add": ["BPF", "NET_ADMIN", "PERFMON"]}
        assert sc["runAsUser"] == 0 and sc["allowPrivilegeEscalation"] is False
        assert {m["mountPath"]: m["readOnly"] for m in container["volumeMounts"]} == {
            resources.SPEC_MOUNT: True, "/lib/modules": True, "/usr/src": True}
        assert {v["name"]: v.get("hostPath", {}).get("path") for v in pod_spec["volumes"]} \
            == {"spec": None, "modules": "/lib/modules", "headers": "/usr/src"}


def test_the_network_status_gathers_what_the_agents_recorded_on_the_pods():
    def pod(links):
        return {"metadata": {"annotations": {resources.ANNOTATION_NETWORK: links}}}
    pods = [pod(json.dumps({"worker-0/tc0": "htb 1 Gbit/s", "rack-0/up": "htb 10 Gbit/s"})),
            pod(json.dumps({"ps-0/tc0": "htb 1 Gbit/s", "rack-0/up": "htb 10 Gbit/s"})),
            pod("not json"), {"metadata": {}}]
    assert resources.network_from_pods(pods) == {
        "ps-0/tc0": "htb 1 Gbit/s", "rack-0/up": "htb 10 Gbit/s",
        "worker-0/tc0": "htb 1 Gbit/s"}


def test_queue_drops_gather_each_link_end_once_keeping_an_uplinks_latest_count():
    def pod(drops):
        return {"metadata": {"annotations": {resources.ANNOTATION_QUEUE_DROPS: drops}}}
    # worker-0 ended first; ps-0 later saw the shared uplink's count grown.
    pods = [pod(json.dumps({"worker-0/tc0": 7, "rack-0/p1": 0, "rack-0/up": 3})),
            pod(json.dumps({"ps-0/tc0": 0, "rack-0/p0": 40, "rack-0/up": 5})),
            pod("not json"), pod(json.dumps({"rack-0/p2": "many"})), {"metadata": {}}]
    assert resources.queue_drops_from_pods(pods) == {
        "total": 52, "byLinkEnd": {"ps-0/tc0": 0, "rack-0/p0": 40, "rack-0/p1": 0,
                                   "rack-0/up": 5, "worker-0/tc0": 7}}
    assert resources.queue_drops_from_pods([{"metadata": {}}]) == {}


def test_only_pods_the_job_controls_and_names_count_as_its_own():
    made = resources.pods(job(1), OWNER, "img:1")   # ps-0 and worker-0, as created
    labelled = {"metadata": {"name": "k8-demo-ps-0-evil",
                             "labels": {resources.LABEL_REPLICA: "ps-0"}}}
    claims = {"metadata": {"name": "k8-demo-evil", "ownerReferences": [OWNER],
                           "labels": {resources.LABEL_REPLICA: "ps-0"}}}
    stale = {"metadata": {**made[0]["metadata"],
                          "ownerReferences": [{**OWNER, "uid": "an-earlier-job"}]}}
    not_controller = {"metadata": {**made[0]["metadata"],
                                   "ownerReferences": [{**OWNER, "controller": False}]}}
    pods = made + [labelled, claims, stale, not_controller]
    assert resources.owned_pods("k8-demo", "1234", pods) == made
    assert resources.controller_uid(made[0]) == "1234"
    assert resources.controller_uid(labelled) is None
    assert resources.controller_uid(not_controller) is None


def allreduce_job():
    return spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                           "metadata": {"name": "k8-demo"},
                           "spec": {"replicas": {"workers": 2},
                                    "training": {"model": "torch-mlp",
                                                 "syncMode": "allreduce"},
                                    "network": {"racks": [{"name": "a"}, {"name": "b"}]}}})


def test_an_allreduce_job_has_worker_pods_only_and_its_figures_come_from_worker_0():
    import pytest
    from tailcut.ml import torchmodel
    if not torchmodel.available():
        pytest.skip("PyTorch is not installed (scripts/setup.sh)")
    job_ = allreduce_job()
    pods = resources.pods(job_, OWNER, "img:1")
    assert [p["metadata"]["name"] for p in pods] == ["k8-demo-worker-0", "k8-demo-worker-1"]
    done = [terminated("worker-0", DONE), terminated("worker-1", "")]
    assert resources.figures_from_pods(job_, done)["jctSeconds"] == 4.2
    assert resources.status_from_pods(job_, done)[0] == "Succeeded"


def test_every_pod_and_container_of_a_job_has_runtime_default_seccomp_and_requests():
    """Training pods, background pods and the background sidecars in training pods:
    what Pod Security's restricted level and a ResourceQuota on requests ask for."""
    from tailcut.k8s.manifests import background

    bg_job = spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                             "metadata": {"name": "k8-bg"}, "spec": {
                                 "replicas": {"workers": 1},
                                 "network": {"racks": [{"name": "rack-0"},
                                                       {"name": "rack-1"}]},
                                 "backgroundLoad": {"senders": ["rack-1"],
                                                    "receivers": ["ps-0"],
                                                    "target": {"requestsPerS": 5}}}})
    asked = {"requests": {"cpu": "250m", "memory": "1Gi"}}
    p = background.plan(bg_job)
    made = background.with_sidecars(
        bg_job, p, resources.pods(bg_job, OWNER, "img:1", container_resources=asked),
        "img:1", container_resources=asked) + background.pods(
            bg_job, p, OWNER, "img:1", container_resources=asked)
    sidecars = [c for pod in made for c in pod["spec"].get("initContainers", [])]
    assert sidecars, "the plan puts a background sidecar in a training pod"
    for pod in made:
        assert pod["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
        for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
            assert c["resources"] == asked, (pod["metadata"]["name"], c["name"])
            assert c["securityContext"]["runAsNonRoot"] is True
    default = resources.pods(job(), OWNER, "img:1")[0]["spec"]["containers"][0]
    assert default["resources"] == resources.DEFAULT_RESOURCES


def test_wiring_errors_come_from_the_agents_annotation_per_replica():
    def pod_with(replica, said=None):
        notes = {resources.ANNOTATION_WIRING_ERROR: said} if said else {}
        return {"metadata": {"labels": {resources.LABEL_REPLICA: replica},
                             "annotations": notes}}
    assert resources.wiring_errors_from_pods(
        [pod_with("worker-1", "node a: AgentError: no bridge"), pod_with("ps-0")]) == {
        "worker-1": "node a: AgentError: no bridge"}
