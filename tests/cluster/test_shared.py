"""tailcut on a shared cluster, as a platform engineer would install it: Pod Security
levels enforced per namespace, a quota on requests, bounded-loss pods only where a
namespace opted in, and a chart upgrade that leaves running agents alone."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.cluster import chart
from tests.cluster.conftest import CHART
from tests.waiting import until

pytestmark = [pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]


def quickstart(name: str, **spec_changes) -> str:
    raw = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    raw["metadata"]["name"] = name
    raw["spec"].update(spec_changes)
    return yaml.safe_dump(raw)


def test_a_tcp_job_succeeds_in_a_restricted_namespace_whose_quota_demands_requests(
        cluster, release, namespace):
    """Pod Security's restricted level enforced, and a ResourceQuota on CPU and memory
    requests (which refuses any pod that states none): the quickstart's pods are
    admitted, wired and the job succeeds."""
    cluster.kubectl("label", "namespace", namespace,
                    "pod-security.kubernetes.io/enforce=restricted")
    cluster.kubectl("-n", namespace, "create", "quota", "requests",
                    "--hard=requests.cpu=4,requests.memory=8Gi")
    # The quota is enforced once the controller-manager has filled in its status: a
    # restricted-level pod that states no requests is then refused.
    no_requests = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
                   "spec": {"securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                                                "seccompProfile": {"type": "RuntimeDefault"}},
                            "containers": [{"name": "c", "image": "x", "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}}}]}}
    def refused() -> str:
        out = cluster.kubectl("-n", namespace, "create", "--dry-run=server", "-f", "-",
                              input=json.dumps(no_requests), check=False)
        return out.stderr if out.returncode else ""
    assert until(lambda: "must specify requests" in refused(), within_s=60, every_s=1), \
        refused()
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=quickstart("rs"))
    status = chart.wait_phase(cluster, namespace, "rs", "Succeeded")
    assert status["replicaStatuses"]["Worker"]["succeeded"] == 4
    assert status["network"]["ps-0/tc0"].startswith("htb 1000 Mbit/s"), status["network"]


def test_a_bounded_loss_job_where_the_namespace_has_not_opted_in_fails_at_once(
        cluster, release, namespace):
    cluster.kubectl("-n", namespace, "apply", "-f", "-",
                    input=quickstart("bl", transport={"type": "bounded-loss", "p": 0.9}))
    status = chart.wait_phase(cluster, namespace, "bl", "Failed", within_s=30)
    failed = {c["type"]: c for c in status["conditions"]}["Failed"]
    assert failed["reason"] == "BoundedLossNotAllowed"
    assert "tailcut.dev/bounded-loss=allowed" in failed["message"], failed["message"]
    assert not chart.owned_objects(cluster, namespace, "bl")


def component_pods(cluster) -> dict[str, str]:
    """name -> uid of the chart's operator and agent pods."""
    pods = chart.get(cluster, chart.RELEASE_NS, "pods", "-l",
                     "app.kubernetes.io/name=tailcut")["items"]
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods
            if p["metadata"]["labels"].get("app.kubernetes.io/component") != "test"}


def test_helm_upgrade_to_a_new_chart_version_restarts_no_agent(cluster, release, tmp_path):
    """A chart version bump that changes nothing the pods run: the DaemonSet's and the
    Deployment's pod templates are unchanged (their generation stays), and every agent
    and operator pod is the one that ran before."""
    def generations():
        return {kind: chart.get(cluster, chart.RELEASE_NS, kind, name)["metadata"]["generation"]
                for kind, name in (("daemonset", "tailcut-agent"),
                                   ("deployment", "tailcut-operator"))}
    before, generations_before = component_pods(cluster), generations()
    bumped = tmp_path / "tailcut"
    shutil.copytree(CHART, bumped)
    meta = yaml.safe_load((bumped / "Chart.yaml").read_text())
    meta["version"] = meta["version"] + "-upgrade.1"
    meta["appVersion"] = str(meta["appVersion"]) + "-upgrade.1"
    (bumped / "Chart.yaml").write_text(yaml.safe_dump(meta))
    try:
        chart.helm(cluster, "upgrade", chart.RELEASE, str(bumped), "--namespace",
                   chart.RELEASE_NS, "--wait", "--timeout", "2m")
        listed = json.loads(chart.helm(cluster, "list", "-n", chart.RELEASE_NS, "-o",
                                       "json").stdout)
        assert listed[0]["chart"] == f"tailcut-{meta['version']}", listed
        assert generations() == generations_before
        assert component_pods(cluster) == before
        ds = chart.get(cluster, chart.RELEASE_NS, "daemonset", "tailcut-agent")
        assert ds["metadata"]["labels"]["helm.sh/chart"] == f"tailcut-{meta['version']}"
    finally:   # the session's other tests expect the chart as it is
        chart.helm(cluster, "upgrade", chart.RELEASE, str(CHART), "--namespace",
                   chart.RELEASE_NS, "--wait", "--timeout", "2m")
    assert component_pods(cluster) == before


def test_an_agent_that_cannot_wire_a_pod_says_so_in_the_jobs_status_and_an_event(
        cluster, release, namespace, tmp_path):
    """What a kind node without the host's /usr/src meets: the agent's mount of it is
    empty, BCC finds no kernel headers for a lossy link's dropper, and the job's owner
    reads why in status.wiringErrors and a WiringFailed event, not in the agent's log."""
    empty = tmp_path / "no-headers"
    empty.mkdir()
    chart.helm(cluster, "upgrade", chart.RELEASE, str(CHART), "--namespace",
               chart.RELEASE_NS, "--reuse-values", "--set",
               f"agent.hostPaths.headers={empty}", "--wait", "--timeout", "3m")
    try:
        lossy = yaml.safe_load(quickstart("nohdr"))
        lossy["spec"]["network"].setdefault("accessLink", {})["loss"] = 0.01
        cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(lossy))

        def wiring_errors():
            body = chart.get(cluster, namespace, "trainingjob", "nohdr") or {}
            return (body.get("status") or {}).get("wiringErrors")
        assert until(wiring_errors, within_s=180, every_s=1), chart.get(
            cluster, namespace, "trainingjob", "nohdr")
        errors = wiring_errors()
        assert all(said.startswith("node tcnode-") for said in errors.values()), errors
        def warned():
            return [e for e in chart.get(cluster, namespace, "events")["items"]
                    if e["reason"] == "WiringFailed" and e["type"] == "Warning"
                    and e["involvedObject"]["name"] == "nohdr"]
        assert until(warned, within_s=30, every_s=1), chart.get(cluster, namespace, "events")
        cluster.kubectl("-n", namespace, "delete", "trainingjob", "nohdr", "--wait=false")
    finally:
        chart.helm(cluster, "upgrade", chart.RELEASE, str(CHART), "--namespace",
                   chart.RELEASE_NS, "--reset-values", "--wait", "--timeout", "3m")
