"""The tables of the chart's privileges in docs/kubernetes.md are what a real API server
says: `kubectl auth can-i` as each service account for every verb of every row, where
the row says (every namespace, or the release's), and the "yes" rows are exactly what
each account's ClusterRole and its Role in the release namespace grant. The table of
the namespaced install (operator.watchNamespaces) is checked the same way by
tests/k8s/test_watch_namespaces.py. And the agent's one write, through a pod's status
subresource, cannot change what the pod runs."""

import json
from pathlib import Path

import pytest
import yaml

from tests.k8s import audit, operator_proc
from tests.k8s.conftest import agent_clients

pytestmark = pytest.mark.k8s
DOC = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"
ACCOUNTS = ("tailcut-operator", "tailcut-agent", "tailcut-test")
WATCH_HEADING = "### With `operator.watchNamespaces`"


def table(watch: bool = False) -> list[tuple[str, bool, str, str, str, str]]:
    """(account, may, verb, resource[.group][/subresource], where, why) per verb of each
    row of the table in "The chart's privileges" (watch: of its subsection on the
    namespaced install)."""
    section = DOC.read_text().split("## The chart's privileges", 1)[1].split("\n## ", 1)[0]
    assert WATCH_HEADING in section, f"no {WATCH_HEADING!r} in the section"
    before, after = section.split(WATCH_HEADING, 1)
    text = after.split("\n### ", 1)[0] if watch else before
    wheres = ("watched", "other", "all") if watch else ("all", "release")
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6 or cells[0] not in ACCOUNTS:
            continue
        account, may, verbs, resources, where, why = cells
        assert may in ("yes", "no"), line
        assert where in wheres, f"{line}: 'in' must be one of {wheres}"
        assert why, f"{line}: no reason given"
        for verb in verbs.split(", "):
            for resource in resources.split(", "):
                rows.append((account, may == "yes", verb, resource, where, why))
    assert rows, "the table has no rows"
    return rows


def as_grant(resource: str, verb: str) -> tuple[str, str, str]:
    """'trainingjobs.tailcut.dev/status' -> ('tailcut.dev', 'trainingjobs/status', verb),
    the shape of audit.granted."""
    name, _, sub = resource.partition("/")
    plural, _, group = name.partition(".")
    return group, plural + (f"/{sub}" if sub else ""), verb


def can_i(cp, namespace_of: str, account: str, verb: str, resource: str,
          namespace=None) -> str:
    """`kubectl auth can-i` as `account` (of namespace `namespace_of`): cluster-wide
    without `namespace`, else in it (for `namespaces`: Namespace `namespace` itself,
    which the API server files under that namespace)."""
    name, _, sub = resource.partition("/")
    what = f"{name}/{namespace}" if namespace and name == "namespaces" else name
    args = ["auth", "can-i", verb, what,
            *(["-n", namespace] if namespace else ["--all-namespaces"]),
            f"--as=system:serviceaccount:{namespace_of}:{account}"]
    if sub:
        args.append(f"--subresource={sub}")
    return cp.kubectl(*args, check=False).stdout.strip()


def check_rows(cp, namespace_of, rows, namespaces: dict[str, list]) -> list[str]:
    """Every row asked where it says (`namespaces`: where -> namespaces, None for
    cluster-wide); what disagrees with the table."""
    wrong = []
    for account, may, verb, resource, where, _ in rows:
        for ns in namespaces[where]:
            answer = can_i(cp, namespace_of, account, verb, resource, ns)
            if answer != ("yes" if may else "no"):
                wrong.append(f"{account} {verb} {resource} in {ns or 'every namespace'}: the "
                             f"table says {'yes' if may else 'no'}, the API server {answer!r}")
    return wrong


def test_the_table_covers_every_account_and_says_no_somewhere():
    rows = table()
    for account in ACCOUNTS:
        assert {may for a, may, *_ in rows if a == account} == {True, False}, account


def test_each_service_account_may_do_exactly_what_the_docs_table_says(control_plane, release):
    rows = table()
    wrong = check_rows(control_plane, release, rows, {"all": [None], "release": [release]})
    assert not wrong, "\n".join(wrong)
    for account in ACCOUNTS:
        for where, granted in (("all", audit.granted(control_plane, account)),
                               ("release", audit.granted(control_plane, account,
                                                         namespace=release))):
            listed = {as_grant(r, v) for a, may, v, r, w, _ in rows
                      if a == account and may and w == where}
            assert listed == granted, (f"{account} in {where}: granted but not in the table: "
                                       f"{granted - listed}; in the table, not granted: "
                                       f"{listed - granted}")


def test_the_helm_test_account_can_do_its_dry_runs_and_nothing_else(control_plane, release):
    """tailcut.k8s.selftest as the chart's tailcut-test account, against the real API
    server: both dry runs answer as they should, and none of its requests is refused
    (the table above says what it may not do)."""
    import kubernetes

    from tailcut.k8s import selftest

    token = control_plane.kubectl("-n", release, "create", "token", "tailcut-test").stdout.strip()
    client = kubernetes.config.new_client_from_config(
        config_file=str(control_plane.user_kubeconfig("helm-test", token)))
    assert selftest.check(kubernetes.client.CustomObjectsApi(client), release) == []
    events = audit.requests_by(control_plane,
                               f"system:serviceaccount:{release}:tailcut-test")
    assert events and not audit.denied(events)
    assert {e["objectRef"]["namespace"] for e in events} == {release}
    stored = control_plane.kubectl("-n", release, "get", "trainingjobs", "-o", "name").stdout
    assert selftest.PREFIX not in stored   # dry runs: nothing stored


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
