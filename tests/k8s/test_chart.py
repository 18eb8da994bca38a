"""The chart's own promises, checked without a cluster: every Linux capability the
agent asks for and every RBAC rule is explained, values match their schema, manifests/
matches the chart."""

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tailcut.k8s.node import devcluster

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "tailcut"


def test_every_agent_capability_has_a_comment_saying_why():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    text = (CHART / "values.yaml").read_text()
    for cap in values["agent"]["capabilities"]:
        line = re.search(rf"^\s*- {cap}\s*#\s*(\S.*)$", text, re.M)
        assert line, f"values.yaml: capability {cap} has no comment saying why"


def test_every_rule_of_both_cluster_roles_has_a_comment_saying_why():
    for name in ("operator-rbac.yaml", "agent-rbac.yaml", "tests/test-rbac.yaml"):
        lines = (CHART / "templates" / name).read_text().splitlines()
        rules = [i for i, line in enumerate(lines) if line.strip().startswith("- apiGroups:")]
        assert rules, f"{name}: no rules found"
        for i in rules:
            assert lines[i - 1].strip().startswith("#"), (
                f"{name}:{i + 1}: a rule without a comment saying why (docs/kubernetes.md's "
                "table has one per rule too)")


def test_default_values_satisfy_the_values_schema():
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) <= set(schema["properties"])
    for key in schema["required"]:
        assert key in values
    allowed = schema["properties"]["agent"]["properties"]["capabilities"]["items"]["enum"]
    assert set(values["agent"]["capabilities"]) <= set(allowed)


def test_the_agents_probes_ask_on_the_nodes_loopback_not_on_the_port_pods_reach():
    """The agent is on the host network: its metrics port is open to every pod, so
    the kubelet's probes go to a second port on 127.0.0.1, which no pod reaches
    (manifests/tailcut.yaml is the chart rendered, checked against it below)."""
    docs = yaml.safe_load_all((REPO / "manifests" / "tailcut.yaml").read_text())
    agent = next(d for d in docs if d and d["kind"] == "DaemonSet")
    container, holder = agent["spec"]["template"]["spec"]["containers"]
    assert (container["name"], holder["name"]) == ("agent", "holder")
    assert "livenessProbe" not in holder and "ports" not in holder
    # the holder only keeps open files: no capability, no host path
    assert holder["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert [m["name"] for m in holder["volumeMounts"]] == ["holder"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {
            "host": "127.0.0.1", "path": "/healthz", "port": int(env["TAILCUT_HEALTH_PORT"])}
    assert env["TAILCUT_HEALTH_PORT"] != env["TAILCUT_METRICS_PORT"]


def render_plain_manifests() -> str:
    """manifests/tailcut.yaml: the chart with default values, without its test hook."""
    out = subprocess.run([str(devcluster.helm_binary()), "template", "tailcut", str(CHART),
                          "--namespace", "tailcut-system", "--set", "tests.enabled=false",
                          "--set", "namespace.create=true",
                          # the operator's pod-update policy, for Kubernetes 1.30 and later
                          "--api-versions",
                          "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"],
                         capture_output=True, text=True, check=True).stdout
    return ("# Generated from helm/tailcut with default values (namespace tailcut-system,\n"
            "# created here with the Pod Security label the agent needs; the operator's\n"
            "# pod-update policy needs Kubernetes 1.30 or later):\n"
            "#   .venv/bin/python tests/k8s/test_chart.py\n"
            "# Apply after manifests/crd.yaml; tests/k8s/test_chart.py fails on drift.\n" + out)


@pytest.mark.k8s
def test_plain_manifests_match_the_chart():
    assert (REPO / "manifests" / "tailcut.yaml").read_text() == render_plain_manifests(), (
        "manifests/tailcut.yaml drifted from the chart: run "
        ".venv/bin/python tests/k8s/test_chart.py")


@pytest.mark.k8s
def test_helm_install_tells_the_user_what_to_run_next(control_plane, release):
    from tests.k8s.conftest import helm   # (the file also runs as a script, without tests/)

    def notes(*values):
        # (an upgrade's dry run: the session's release holds the chart's cluster roles)
        done = helm(control_plane, "upgrade", "tailcut", str(CHART), "--namespace", release,
                    "--dry-run", *values, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout.split("NOTES:", 1)[1]
    said = notes()
    assert f"helm test tailcut --namespace {release}" in said
    assert "kubectl -n lab apply -f examples/quickstart.yaml" in said
    assert "workers.torchImage" in said   # empty by default: how to fill it
    assert "workers.torchImage" not in notes("--set", "workers.torchImage=t")


if __name__ == "__main__":
    (REPO / "manifests" / "tailcut.yaml").write_text(render_plain_manifests())
    print("wrote manifests/tailcut.yaml")
