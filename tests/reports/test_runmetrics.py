"""metrics.json is built and written in one place (tailcut.reports.runmetrics) for both
executors: `tailcut run` and `tailcut collect` leave the same fields."""

import json

import pytest

from tailcut import spec
from tailcut.k8s import collect
from tailcut.reports import runmetrics
from tailcut.training import tcpstats

DONE = {"event": "done", "converged": True, "jct_s": "2.5", "epochs": 3, "iterations": 30,
        "final_accuracy": 0.91, "final_loss": 0.3, "role": "ps-0"}
# what every metrics.json holds, whichever executor wrote it (readers: tailcut compare,
# reproduce, the operator, the reports, the tests)
FIELDS = {"job", "results_dir", "backend", "converged", "jct_s", "epochs", "iterations",
          "final_accuracy", "final_loss", "tcp_retrans_segs", "tcp_rto_timeouts",
          "fidelity", "transport", "model", "target_accuracy", "parameter_servers",
          "sync_mode", "staleness", "ordering", "aggregators", "ps_replica", "finished_by",
          "takeover", "scheduling", "tcp_counters", "cpu"}


def job(transport: str = "tcp", name: str = "m"):
    return spec.load_text(f"kind: TrainingJob\nmetadata: {{name: {name}}}\n"
                          f"spec: {{replicas: {{workers: 2}}, transport: {{type: {transport}}}}}\n")


def test_the_document_has_every_field_with_the_done_events_values_typed(tmp_path):
    doc = runmetrics.build(job(), DONE, tmp_path, backend="local", fidelity={"verdict": "x"},
                           scheduling={"policy": "fair"})
    assert set(doc) == FIELDS
    assert doc["backend"] == "local" and doc["job"] == "m"
    assert doc["jct_s"] == 2.5 and isinstance(doc["jct_s"], float)
    assert doc["converged"] is True and doc["epochs"] == 3 and doc["iterations"] == 30
    assert doc["fidelity"] == {"verdict": "x"} and doc["scheduling"] == {"policy": "fair"}
    assert doc["finished_by"] == "ps-0" and doc["takeover"] is None
    assert doc["sync_mode"] == "bsp" and doc["parameter_servers"] == 1
    # no pod reported its counters: None, as RunResult has them
    assert doc["tcp_retrans_segs"] is None and doc["tcp_rto_timeouts"] is None
    assert doc["tcp_counters"]["missing"] == ["ps-0", "worker-0", "worker-1"]


def test_the_tcp_totals_come_from_the_pods_counters(tmp_path):
    for pod, retrans in (("ps-0", 3), ("worker-1", 4)):
        tcpstats.write(tmp_path, pod, {**{k: 1 for k in tcpstats.FIELDS},
                                       "retrans_segs": retrans})
    doc = runmetrics.build(job(), DONE, tmp_path, backend="kubernetes", fidelity=None,
                           scheduling=None, cores=0)
    assert doc["tcp_retrans_segs"] == 7 and doc["tcp_rto_timeouts"] == 2
    assert doc["tcp_counters"]["missing"] == ["worker-0"]
    assert doc["cpu"]["cores"] == 0 and doc["cpu"]["busy"] is None   # unknown


def test_datagram_transports_add_delivery_and_extra_sections_are_kept(tmp_path):
    doc = runmetrics.build(job("bounded-loss, p: 0.9"), DONE, tmp_path, backend="local",
                           fidelity=None, scheduling=None, extra={"rtt": {"pairs": []}})
    assert doc["delivery"] == {"messages": 0} and doc["rtt"] == {"pairs": []}
    assert "delivery" not in runmetrics.build(job(), DONE, tmp_path, backend="local",
                                              fidelity=None, scheduling=None)


def test_an_unknown_backend_is_refused(tmp_path):
    with pytest.raises(ValueError, match="backend='docker'"):
        runmetrics.build(job(), DONE, tmp_path, backend="docker", fidelity=None,
                         scheduling=None)


def test_write_puts_the_document_in_metrics_json_and_rewrites_it(tmp_path):
    doc = {"job": "m", "jct_s": 1.0}
    path = runmetrics.write(tmp_path, doc)
    assert path == tmp_path / "metrics.json"
    assert path.read_text().endswith("}\n") and json.loads(path.read_text()) == doc
    runmetrics.write(tmp_path, {**doc, "overhead_s": {"total": 0.5}})
    assert json.loads(path.read_text())["overhead_s"] == {"total": 0.5}


def test_tailcut_collect_writes_what_tailcut_run_writes(tmp_path):
    """The Kubernetes path's metrics.json has every field of the local one's (all but
    what only the local runner measures), with backend "kubernetes"."""
    results = tmp_path / "results"
    results.mkdir()
    lines: list[str] = []
    collect.write_report(job(name="k"), DONE, results, lines.append)
    written = json.loads((results / "metrics.json").read_text())
    assert set(written) == FIELDS
    assert written["backend"] == "kubernetes" and written["finished_by"] == "ps-0"
    assert json.loads((results / "flows.json").read_text()) == written["scheduling"]
    local = runmetrics.build(job(name="k"), DONE, results, backend="local",
                             fidelity=written["fidelity"], scheduling=written["scheduling"],
                             cores=0)
    assert {k: v for k, v in written.items() if k != "backend"} == \
        {k: v for k, v in local.items() if k != "backend"}
