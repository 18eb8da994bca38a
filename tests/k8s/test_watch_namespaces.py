"""The chart's namespaced install (operator.watchNamespaces) against the real API
server: the session's release upgraded to watch two fresh namespaces, a third left
out (the chart's cluster roles have fixed names, so it is the same release, upgraded
back to the default values after this module).

- what the operator's service account may do is docs/kubernetes.md's table of the
  namespaced install, row by row (`kubectl auth can-i`), and exactly the rules of its
  ClusterRole and of its Role in each watched namespace: nothing in the third;
- the operator started as the installed Deployment starts it (kopf's --namespace for
  each, its environment) with that account's token makes a watched namespace's job's
  pods and nothing for a job of the third, and every request it makes is allowed and
  in a watched namespace, or lists nodes."""

import time
import uuid

import pytest
import yaml

from tests.k8s import audit, operator_proc
from tests.k8s.conftest import CHART, helm, operator_kubeconfig
from tests.k8s.test_privileges import as_grant, check_rows, table

pytestmark = pytest.mark.k8s
ACCOUNT = "tailcut-operator"


@pytest.fixture(scope="module")
def watched(control_plane, release):
    """{'a', 'b' (watched), 'other'} -> namespace; the release watching a and b."""
    names = {w: f"k8-{w}-{uuid.uuid4().hex[:6]}" for w in ("a", "b", "other")}
    for name in names.values():
        control_plane.kubectl("create", "namespace", name)
        control_plane.kubectl("-n", name, "create", "serviceaccount", "default")
    done = helm(control_plane, "upgrade", "tailcut", str(CHART), "--namespace", release,
                "--set", f"operator.watchNamespaces={{{names['a']},{names['b']}}}", check=False)
    try:
        assert done.returncode == 0, done.stderr
        yield names
    finally:
        helm(control_plane, "upgrade", "tailcut", str(CHART), "--namespace", release)


def test_the_values_schema_takes_namespace_names_only(control_plane):
    bad = helm(control_plane, "template", "tailcut", str(CHART), "--set",
               "operator.watchNamespaces={Team_A}", check=False)
    assert bad.returncode != 0 and "operator.watchNamespaces" in bad.stderr
    ok = helm(control_plane, "template", "tailcut", str(CHART), "--set",
              "operator.watchNamespaces={team-a,team-b}").stdout
    deploy = next(d for d in yaml.safe_load_all(ok) if d and d["kind"] == "Deployment"
                  and d["metadata"]["name"] == "tailcut-operator")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    assert "--all-namespaces" not in args


def test_the_operator_has_no_rights_outside_the_watched_namespaces(control_plane, release,
                                                                    watched):
    rows = table(watch=True)
    wrong = check_rows(control_plane, release, rows, {
        "watched": [watched["a"], watched["b"]], "other": [watched["other"]], "all": [None]})
    assert not wrong, "\n".join(wrong)
    listed = {where: {as_grant(r, v) for a, may, v, r, w, _ in rows if may and w == where}
              for where in ("all", "watched")}
    assert audit.granted(control_plane, ACCOUNT) == listed["all"]
    for ns in (watched["a"], watched["b"]):
        assert audit.granted(control_plane, ACCOUNT, namespace=ns) == listed["watched"], ns
    bound = operator_proc.get_json(control_plane, "get", "rolebindings", "--all-namespaces")
    assert {b["metadata"]["namespace"] for b in bound["items"]
            if any(s.get("name") == ACCOUNT for s in b.get("subjects") or [])} == {
        watched["a"], watched["b"]}


def _job(cp, namespace, name):
    cp.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name}, "spec": {"replicas": {"workers": 1}}}))


def _made(cp, namespace, name):
    """(status, pod names) of the job."""
    tj = operator_proc.get_json(cp, "-n", namespace, "get", "trainingjob", name)
    pods = operator_proc.get_json(cp, "-n", namespace, "get", "pods")["items"]
    return tj.get("status"), sorted(p["metadata"]["name"] for p in pods)


def test_the_operator_as_installed_makes_jobs_of_the_watched_namespaces_only(
        control_plane, release, watched, tmp_path):
    cp = control_plane
    manifest = helm(cp, "get", "manifest", "tailcut", "--namespace", release).stdout
    deploy = next(d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "Deployment"
                  and d["metadata"]["name"] == "tailcut-operator")
    user = f"system:serviceaccount:{release}:{ACCOUNT}"
    seen_before = len(audit.requests_by(cp, user))
    log = tmp_path / "operator.log"
    proc = operator_proc.start_as_deployed(operator_kubeconfig(cp, release, "watching"), log,
                                           deploy)
    try:
        _job(cp, watched["other"], "k8-outside")
        started = time.monotonic()
        for w in ("a", "b"):
            _job(cp, watched[w], "k8-inside")
        for w in ("a", "b"):
            operator_proc.wait_for(
                lambda: (lambda s, pods: s and s.get("phase") == "Pending" and len(pods) == 2)(
                    *_made(cp, watched[w], "k8-inside")), 60,
                f"the job in watched namespace {w} to get its pods", log)
        took = time.monotonic() - started
        # As long again and 10 s more, the job outside stays untouched.
        deadline = time.monotonic() + took + 10
        while time.monotonic() < deadline:
            assert _made(cp, watched["other"], "k8-outside") == (None, []), log.read_text()
            time.sleep(0.5)
        tj = operator_proc.get_json(cp, "-n", watched["other"], "get", "trainingjob",
                                    "k8-outside")
        assert not any(k.startswith("tailcut.dev/")
                       for k in tj["metadata"].get("annotations") or {})
    finally:
        operator_proc.stop(proc)
    events = audit.requests_by(cp, user)[seen_before:]
    assert events and not audit.denied(events), audit.denied(events)
    outside = sorted({(e["verb"], e["objectRef"].get("resource"),
                       e["objectRef"].get("namespace")) for e in events
                      if e["objectRef"].get("namespace") not in (watched["a"], watched["b"])
                      and e["objectRef"].get("resource") != "nodes"})
    assert not outside, f"requests outside the watched namespaces: {outside}"
    text = log.read_text()
    assert "Not enough permissions" not in text, text[-3000:]
