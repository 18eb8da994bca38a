"""The table of the chart's privileges in docs/kubernetes.md is what a real API server
says: `kubectl auth can-i` as each service account for every verb of every row, and
the "yes" rows are exactly what each ClusterRole grants. And the agent's one write,
through a pod's status subresource, cannot change what the pod runs."""

import json
from pathlib import Path

import pytest
import yaml

from tests.k8s import audit, operator_proc
from tests.k8s.conftest import agent_clients

pytestmark = pytest.mark.k8s
DOC = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"
ACCOUNTS = ("tailcut-operator", "tailcut-agent")


def table() -> list[tuple[str, bool, str, str, str]]:
    """(account, may, verb, resource[.group][/subresource], why) per verb of each row
    of the table in "The chart's privileges"."""
    section = DOC.read_text().split("## The chart's privileges", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[0] not in ACCOUNTS:
            continue
        account, may, verbs, resources, why = cells
        assert may in ("yes", "no"), line
        assert why, f"{line}: no reason given"
        for verb in verbs.split(", "):
            for resource in resources.split(", "):
                rows.append((account, may == "yes", verb, resource, why))
    return rows


def as_grant(resource: str, verb: str) -> tuple[str, str, str]:
    """'trainingjobs.tailcut.dev/status' -> ('tailcut.dev', 'trainingjobs/status', verb),
    the shape of audit.granted."""
    name, _, sub = resource.partition("/")
    plural, _, group = name.partition(".")
    return group, plural + (f"/{sub}" if sub else ""), verb


def test_the_table_covers_both_accounts_and_says_no_somewhere():
    rows = table()
    for account in ACCOUNTS:
        assert {may for a, may, *_ in rows if a == account} == {True, False}, account


def test_each_service_account_may_do_exactly_what_the_docs_table_says(control_plane, release):
    wrong = []
    for account, may, verb, resource, _ in table():
        name, _, sub = resource.partition("/")
        args = ["auth", "can-i", verb, name, "--all-namespaces",
                f"--as=system:serviceaccount:{release}:{account}"]
        if sub:
            args.append(f"--subresource={sub}")
        answer = control_plane.kubectl(*args, check=False).stdout.strip()
        if answer != ("yes" if may else "no"):
            wrong.append(f"{account} {verb} {resource}: the table says "
                         f"{'yes' if may else 'no'}, the API server {answer!r}")
    assert not wrong, "\n".join(wrong)
    for account in ACCOUNTS:
        listed = {as_grant(r, v) for a, may, v, r, _ in table() if a == account and may}
        granted = audit.granted(control_plane, account)
        assert listed == granted, (f"{account}: granted but not in the table: "
                                   f"{granted - listed}; in the table, not granted: "
                                   f"{listed - granted}")


def test_the_agent_can_annotate_a_pod_through_its_status_but_not_change_what_it_runs(
        control_plane, release, namespace):
    cp = control_plane
    owner = {"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob", "name": "k8-x",
             "uid": "0f0f0f0f-0000-4000-8000-000000000000", "controller": True}
    cp.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "k8-victim", "ownerReferences": [owner]},
        "spec": {"containers": [{"name": "c", "image": "registry.example/good:1"}]}}))
    core, _ = agent_clients(cp, release, "agent-privileges")
    evil = {"metadata": {"annotations": {"tailcut.dev/network": "{}"}, "ownerReferences": []},
            "spec": {"containers": [{"name": "c", "image": "registry.example/evil:1"}]}}
    # (Patching the pod itself it may not: the table's "no" row, asked with can-i, not
    # tried here, where a refused request would spoil test_agent_rbac's audit trail.)
    core.patch_namespaced_pod_status("k8-victim", namespace, evil)   # the agent's write
    pod = operator_proc.get_json(cp, "-n", namespace, "get", "pod", "k8-victim")
    assert pod["metadata"]["annotations"]["tailcut.dev/network"] == "{}"
    assert pod["spec"]["containers"][0]["image"] == "registry.example/good:1"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == owner["uid"]
