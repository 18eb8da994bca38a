"""spec.backgroundLoad on a real API server: the operator (with the chart's RBAC)
creates the background config map, server and Locust pods and sidecars, placed with
their racks, owned by the job and bounded in time; a bad backgroundLoad creates nothing.
There is no kubelet: the objects are checked, not run (tests/background/test_pod.py
runs the same entrypoint as processes)."""

import json
import math

import pytest
import yaml

from tailcut import spec
from tailcut.background import launch
from tailcut.k8s.manifests import background, resources
from tailcut.net import topology
from tailcut.spec import flowsizes
from tests.k8s import operator_proc
from tests.k8s.conftest import operator_kubeconfig

pytestmark = pytest.mark.k8s


@pytest.fixture(scope="module")
def operator(control_plane, release, tmp_path_factory):
    """The operator as the chart's service account."""
    kubeconfig = operator_kubeconfig(control_plane, release, "k8sbg-operator")
    log = tmp_path_factory.mktemp("k8sbg-operator") / "operator.log"
    proc = operator_proc.start(kubeconfig, log)
    try:
        yield log
    finally:
        operator_proc.stop(proc)


RACKS = {"racks": [{"name": "rack-0"}, {"name": "rack-1"}],
         "placement": {"ps-0": "rack-0", "worker-0": "rack-0", "worker-1": "rack-1"}}


def apply(cp, namespace, name, spec):
    cp.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name}, "spec": spec}))


def wait_phase(cp, namespace, name, phase, log):
    def check():
        tj = operator_proc.get_json(cp, "-n", namespace, "get", "trainingjob", name)
        return tj if (tj.get("status") or {}).get("phase") == phase else None
    return operator_proc.wait_for(check, 60, f"{namespace}/{name} to be {phase}", log)


def by_replica(cp, namespace, job):
    pods = operator_proc.get_json(cp, "-n", namespace, "get", "pods", "-l",
                                  f"{resources.LABEL_JOB}={job}")["items"]
    return {p["metadata"]["labels"][resources.LABEL_REPLICA]: p for p in pods}


def test_a_job_with_background_load_gets_server_and_locust_pods_on_their_racks(
        control_plane, namespace, operator):
    """senders: [rack-1] -> a server pod in rack-1; receivers: [rack-0, ps-0] -> a
    Locust pod in rack-0 (master and worker) and a Locust worker sidecar in ps-0."""
    job = "k8sbg-racks"
    apply(control_plane, namespace, job, {
        "replicas": {"workers": 2}, "network": RACKS,
        "backgroundLoad": {"senders": ["rack-1"], "receivers": ["rack-0", "ps-0"],
                           "target": {"link": "uplink/rack-1", "loadFactor": 0.5},
                           "flowSizes": {"distribution": "web-search"},
                           "shape": {"type": "onOff", "onS": 2, "offS": 3},
                           "durationS": 30}})
    tj = wait_phase(control_plane, namespace, job, "Pending", operator)
    uid = tj["metadata"]["uid"]
    pods = by_replica(control_plane, namespace, job)
    assert sorted(pods) == ["bg-client-0", "bg-server-0", "ps-0", "worker-0", "worker-1"]
    server, client = pods["bg-server-0"], pods["bg-client-0"]

    # Placement: the rack label and the same rack affinity as the rack's training pods.
    for bg, rack, role in ((server, "rack-1", "bg-server"), (client, "rack-0", "bg-client")):
        labels = bg["metadata"]["labels"]
        assert (labels[resources.LABEL_RACK], labels[resources.LABEL_ROLE]) == (rack, role)
        term = bg["spec"]["affinity"]["podAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
        assert {"key": resources.LABEL_RACK, "operator": "In", "values": [rack]} in \
            term["labelSelector"]["matchExpressions"]
        assert bg["spec"]["affinity"] == pods["ps-0" if rack == "rack-0" else "worker-1"][
            "spec"]["affinity"]
        # The agent wires what the job controls, as it wires training pods.
        (owner,) = bg["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("TrainingJob", job, True)
        assert (bg["spec"]["hostname"], bg["spec"]["subdomain"]) == (
            labels[resources.LABEL_REPLICA], job)
        # Bounded: the run (30 s) + the servers' stop grace + a start-up margin.
        assert bg["spec"]["activeDeadlineSeconds"] == math.ceil(
            30 + 2 * launch.LOCUST_STOP_GRACE_S + background.DEADLINE_MARGIN_S)
        assert bg["spec"]["restartPolicy"] == "Never"
        assert bg["spec"]["automountServiceAccountToken"] is False
    # Roles: not the worker entrypoint, which refuses them.
    (srv,) = server["spec"]["containers"]
    assert srv["command"] == ["python", "-m", "tailcut.background.pod"]
    assert srv["args"][0] == "server" and srv["ports"][0]["containerPort"] == 8080
    assert [(c["name"], c["args"][:3]) for c in client["spec"]["containers"]] == [
        ("locust-master", ["locust", "--mode", "master"]),
        ("locust", ["locust", "--mode", "worker"])]
    # ps-0 receives too: a Locust worker as a native sidecar, staying until ps-0 ends.
    (sidecar,) = pods["ps-0"]["spec"]["initContainers"]
    assert sidecar["name"] == "locust" and sidecar["restartPolicy"] == "Always"
    assert sidecar["args"][:3] == ["locust", "--mode", "worker"] and "--stay" in sidecar["args"]
    assert [c["name"] for c in pods["ps-0"]["spec"]["containers"]] == ["ps"]
    assert "initContainers" not in pods["worker-0"]["spec"]
    assert "activeDeadlineSeconds" not in pods["ps-0"]["spec"]   # training is not cut

    cm = operator_proc.get_json(control_plane, "-n", namespace, "get", "configmap",
                                f"{job}-background")
    for obj in [server, client, cm]:
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "TrainingJob", job, uid, True)
    # Every background container mounts it.
    for c in [srv, sidecar, *client["spec"]["containers"]]:
        assert any(m["mountPath"] == background.CONFIG_MOUNT for m in c["volumeMounts"])
    config = json.loads(cm["data"][background.CONFIG_KEY])
    topo = topology.plan(spec.from_dict({"apiVersion": tj["apiVersion"], "kind": tj["kind"],
                                         "metadata": {"name": job}, "spec": tj["spec"]}))
    assert config["servers"] == [f"http://{topo.pod('bg-server-0').ip}:8080"]
    assert config["master_host"] == topo.pod("bg-client-0").ip and config["clients"] == 2
    mean = flowsizes.mean_bytes(flowsizes.CDFS["web-search"])
    assert config["requests_per_s"] == pytest.approx(0.5 * 1e9 / 8 / (mean + 120))
    assert config["cdf"] == [list(p) for p in flowsizes.CDFS["web-search"]]
    assert config["shape"]["type"] == "onOff" and config["shape"]["onS"] == 2
    assert config["run_time_s"] == 30
    assert config["target"] == {"link": "uplink/rack-1", "direction": "up",
                                "loadFactor": 0.5, "linkBandwidthBit": 10**9}

    # The status says what runs where and where Locust's CSVs end up (written at the
    # end of the reconcile; a pod event may have set Pending before).
    def described():
        tj = operator_proc.get_json(control_plane, "-n", namespace, "get", "trainingjob", job)
        bgs = (tj.get("status") or {}).get("background") or {}
        return bgs if "servers" in bgs else None
    bgs = operator_proc.wait_for(described, 30, "status.background", operator)
    assert bgs["servers"] == [f"{job}-bg-server-0"]
    assert bgs["clients"] == [f"{job}-bg-client-0", f"{job}-ps-0"]
    assert f"logs {job}-bg-client-0 -c locust-master" in bgs["locustStats"]
    assert bgs["targetLoadFactor"] == 0.5 and bgs["runTimeS"] == 30


def test_background_pods_do_not_change_the_training_status(control_plane, namespace,
                                                           operator):
    """The job runs and succeeds on its training pods; background pods are extra."""
    job = "k8sbg-status"
    apply(control_plane, namespace, job, {
        "replicas": {"workers": 1},
        "backgroundLoad": {"senders": ["worker-0"], "receivers": ["ps-0"],
                           "target": {"requestsPerS": 5}, "durationS": 10}})
    wait_phase(control_plane, namespace, job, "Pending", operator)
    pods = by_replica(control_plane, namespace, job)
    assert sorted(pods) == ["ps-0", "worker-0"]   # both ends share training pods
    assert [c["name"] for c in pods["worker-0"]["spec"]["initContainers"]] == ["bg-server"]
    assert [c["name"] for c in pods["ps-0"]["spec"]["initContainers"]] == ["locust"]
    for replica in ("ps-0", "worker-0"):
        control_plane.kubectl("-n", namespace, "patch", "pod", f"{job}-{replica}",
                              "--subresource=status", "--type=merge",
                              "-p", json.dumps({"status": {"phase": "Running"}}))
    tj = wait_phase(control_plane, namespace, job, "Running", operator)
    assert set(tj["status"]["replicaStatuses"]) == {"PS", "Worker"}


@pytest.mark.parametrize("load,words", [
    ({"senders": ["rack-9"], "receivers": ["ps-0"], "target": {"requestsPerS": 5}},
     ["spec.backgroundLoad.senders[0]", "rack-9"]),
    ({"senders": ["worker-0"], "receivers": ["ps-0"],
      "target": {"link": "uplink/rack-0", "loadFactor": 0.5}},
     ["spec.backgroundLoad.target.link", "do not cross"]),
    # 1 Gbit/s of 100-byte flows: 568,000 flows/s, more than Locust drives.
    ({"senders": ["worker-0"], "receivers": ["ps-0"],
      "target": {"link": "access/ps-0", "loadFactor": 1.0},
      "flowSizes": {"distribution": "fixed", "bytes": 100}},
     ["spec.backgroundLoad.target", "requests/s"]),
], ids=["unknown-rack", "link-not-crossed", "rate-too-high"])
def test_a_bad_background_load_fails_the_job_and_creates_nothing(
        control_plane, namespace, operator, load, words):
    job = "k8sbg-bad"
    apply(control_plane, namespace, job, {"replicas": {"workers": 1}, "backgroundLoad": load})
    tj = wait_phase(control_plane, namespace, job, "Failed", operator)
    failed = {c["type"]: c for c in tj["status"]["conditions"]}["Failed"]
    assert failed["reason"] == "InvalidSpec"
    for word in words:
        assert word in failed["message"], failed["message"]
    assert not operator_proc.get_json(control_plane, "-n", namespace, "get", "pods")["items"]
    maps = operator_proc.get_json(control_plane, "-n", namespace, "get", "configmaps")["items"]
    assert not [m for m in maps if m["metadata"]["name"].startswith(job)]
    assert "background" not in tj["status"]


def test_the_api_server_refuses_a_load_factor_above_one_naming_the_field(
        control_plane, namespace):
    result = control_plane.kubectl("-n", namespace, "apply", "-f", "-", check=False,
                                   input=yaml.safe_dump({
                                       "apiVersion": "tailcut.dev/v1alpha1",
                                       "kind": "TrainingJob", "metadata": {"name": "k8sbg-lf"},
                                       "spec": {"backgroundLoad": {
                                           "senders": ["worker-0"], "receivers": ["ps-0"],
                                           "target": {"link": "access/ps-0",
                                                      "loadFactor": 1.5}}}}))
    assert result.returncode != 0
    assert "spec.backgroundLoad.target.loadFactor" in result.stderr


def test_background_pod_phases_and_the_servers_sent_report_reach_the_status(
        control_plane, namespace, operator):
    """The kubelet's part is played by patching pod status: a server container ends
    with the JSON line tailcut.background.pod writes as its termination message."""
    job = "k8sbg-sent"
    apply(control_plane, namespace, job, {
        "replicas": {"workers": 1},
        "network": {"racks": [{"name": "rack-0"}, {"name": "rack-1"}]},
        "backgroundLoad": {"senders": ["rack-1"], "receivers": ["ps-0"],
                           "target": {"link": "uplink/rack-1", "loadFactor": 0.4},
                           "durationS": 20}})
    wait_phase(control_plane, namespace, job, "Pending", operator)
    sent = {"sent": {"interface": "eth0", "tx_bytes": 1_000_000_000, "seconds": 20.0,
                     "mbit_per_s": 400.0, "load_factor_of_target_link": 0.4}}
    control_plane.kubectl(
        "-n", namespace, "patch", "pod", f"{job}-bg-server-0", "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": {"phase": "Succeeded",
                                                     "containerStatuses": [{
            "name": "bg-server", "image": "x", "imageID": "", "ready": False,
            "restartCount": 0, "state": {"terminated": {
                "exitCode": 0, "reason": "Completed", "message": json.dumps(sent)}}}]}}))

    def reported():
        tj = operator_proc.get_json(control_plane, "-n", namespace, "get", "trainingjob", job)
        bgs = (tj.get("status") or {}).get("background") or {}
        return bgs if bgs.get("serversReported") == 1 else None
    bgs = operator_proc.wait_for(reported, 30, "the servers' report in the status", operator)
    assert bgs["sentLoadFactor"] == 0.4 and bgs["sentMbitPerS"] == 400.0
    assert bgs["pods"] == {"active": 0, "succeeded": 1, "failed": 0}
    # The reconcile's part is still there: the two writers merge.
    assert bgs["configMap"] == f"{job}-background" and bgs["targetLoadFactor"] == 0.4
