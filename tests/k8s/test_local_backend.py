"""End to end: `kubectl apply` of the quickstart TrainingJob, with the operator's local
backend, runs real training on this host and lands JCT and accuracy in the status."""

from pathlib import Path

import pytest
import yaml

from tests.k8s import operator_proc

pytestmark = [pytest.mark.k8s, pytest.mark.e2e]
REPO = Path(__file__).resolve().parents[2]


def test_kubectl_apply_of_the_quickstart_reaches_succeeded_with_jct_and_accuracy(
        control_plane, namespace, tmp_path):
    job = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    job["metadata"]["name"] = "k8-quickstart"   # unique on this shared host
    log = tmp_path / "operator.log"
    # Only this namespace: the other tests' jobs are not for the local backend. A
    # person runs this backend with their own kubeconfig (here the admin's): kopf
    # watching named namespaces also lists namespaces, which the chart's -A role omits.
    proc = operator_proc.start(control_plane.kubeconfig, log,
                               backend="local", namespace=namespace,
                               extra_env={"TAILCUT_RESULTS_DIR": str(tmp_path / "results")})
    try:
        control_plane.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(job))

        def finished():
            tj = operator_proc.get_json(control_plane, "-n", namespace, "get", "trainingjob",
                                        "k8-quickstart")
            phase = (tj.get("status") or {}).get("phase")
            return tj if phase in ("Succeeded", "Failed") else None
        tj = operator_proc.wait_for(finished, 180, "the quickstart to finish", log)
    finally:
        operator_proc.stop(proc)
    status = tj["status"]
    assert status["phase"] == "Succeeded", status
    assert status["accuracy"] >= 0.93 and status["converged"] is True
    assert 0 < status["jctSeconds"] < 180
    assert status["backend"] == "local"
    assert Path(status["resultsDir"], "metrics.json").exists()
    table = control_plane.kubectl("-n", namespace, "get", "trainingjobs").stdout
    header, row = table.splitlines()[:2]
    assert header.split()[:6] == ["NAME", "PHASE", "TRANSPORT", "P", "PROGRESS", "JCT-S"]
    assert row.split()[:2] == ["k8-quickstart", "Succeeded"]
    assert f"{status['accuracy']}" in row and f"{status['jctSeconds']}" in row
