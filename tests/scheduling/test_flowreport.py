"""The per-tensor flow summary a run records: iteration time, phases, FCT per tensor."""

import csv

import pytest

from tailcut.scheduling import flowreport
from tailcut.training import flows, flowsection
from tailcut.training import shards

MS = 1_000_000


def _write(path, rows):
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, flows.FIELDS)
        w.writeheader()
        for kind, it, layer, level, sent, done in rows:
            w.writerow({"kind": kind, "iteration": it, "sender": 0, "receiver": "x",
                        "layer": layer, "level": level, "bytes": 4, "sent_at_ns": sent,
                        "received_at_ns": done, "completion_s": (done - sent) / 1e9})


def test_iteration_time_is_the_median_gap_between_pull_starts_and_fcts_are_per_tensor(tmp_path):
    rows = []
    for it, start in enumerate((0, 100 * MS, 300 * MS, 400 * MS)):
        rows += [("PARAMS", it, "a", 0, start, start + 10 * MS),
                 ("PARAMS", it, "b", 1, start, start + 40 * MS),
                 ("PUSH", it, "a", 0, start + 50 * MS, start + 60 * MS),
                 ("PUSH", it, "b", 1, start + 50 * MS, start + 90 * MS)]
    _write(tmp_path / "flows-worker-0.csv", rows[:8])
    _write(tmp_path / "flows-ps-0.csv", rows[8:])
    summary = flowreport.summarize(tmp_path, "cadentflow")
    assert summary["iteration_s"] == 0.1 and summary["iterations_measured"] == 3  # 100, 200, 100
    assert summary["phases_s"] == {"last_pull_done": 0.04, "first_push_sent": 0.05,
                                   "last_push_done": 0.09}
    assert summary["fct_s"]["pull"]["a"] == {"level": 0, "median": 0.01, "p95": 0.01, "n": 4}
    assert summary["fct_s"]["push"]["b"]["median"] == 0.04
    assert "iteration 100.0 ms" in flowreport.describe(summary)


def test_a_run_without_flow_rows_says_so(tmp_path):
    summary = flowreport.summarize(tmp_path, "fair")
    assert summary["iteration_s"] is None and summary["phases_s"] is None
    assert flowreport.describe(summary) == "fair: no complete iteration measured"


def test_per_flow_fct_and_coflow_spread_come_from_each_messages_first_send_and_last_part(
        tmp_path):
    with (tmp_path / "flows-worker-0.csv").open("w", newline="") as f0, \
            (tmp_path / "flows-worker-1.csv").open("w", newline="") as f1:
        w0, w1 = csv.DictWriter(f0, flows.FIELDS), csv.DictWriter(f1, flows.FIELDS)
        w0.writeheader()
        w1.writeheader()
        for it in range(2):
            start = it * 100 * MS
            for writer, name, end_ms in ((w0, "worker-0", 40), (w1, "worker-1", 46)):
                for layer, done_ms in (("a", 10), ("b", end_ms)):  # parts: b ends the flow
                    writer.writerow({"kind": "PARAMS", "iteration": it, "sender": -1,
                                     "receiver": name, "layer": layer, "level": "",
                                     "bytes": 4, "sent_at_ns": start,
                                     "received_at_ns": start + done_ms * MS,
                                     "completion_s": done_ms / 1e3})
    summary = flowreport.summarize(tmp_path, "coflow")
    assert summary["flow_fct_s"]["pull"] == {
        "-1->worker-0": {"median": 0.04, "p95": 0.04, "n": 2},
        "-1->worker-1": {"median": 0.046, "p95": 0.046, "n": 2}}
    assert summary["coflow_spread_s"]["pull"] == {"median": 0.006, "p95": 0.006, "n": 2}
    assert summary["coflow_spread_s"]["push"] is None
    assert summary["fct_s"]["pull"]["a"]["level"] is None
    assert "pulls ended within 6.0 ms of each other" in flowreport.describe(summary)


def test_a_coflow_jobs_roles_get_each_flows_madd_rate_from_sizes_and_links():
    from tailcut import spec
    from tailcut.scheduling import madd
    from tailcut.training import ps

    job = spec.from_dict({
        "apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": "cof-roles"},
        "spec": {"replicas": {"workers": 2, "parameterServers": 2},
                 "network": {"accessLink": {"bandwidth": "100Mbit"}},
                 "scheduling": {"policy": "coflow"}}})
    pace = flowreport.coflow_pace(job, 1001)
    link = 100e6 / 8 * 1448 / 1514 * madd.HEADROOM
    big, small = 4 * 501, 4 * 500  # shard 0 holds the odd value
    # Pull: each PS link carries its shard to both workers; the busier one (ps-0) sets
    # Gamma = 2 * big / link, and every flow runs at its bytes / Gamma.
    gamma = 2 * big / link
    assert pace["ps-0"]["worker-0"] == pytest.approx(big / gamma, rel=1e-6)
    assert pace["ps-1"]["worker-1"] == pytest.approx(small / gamma, rel=1e-6)
    # Push: the same sizes the other way round, and the same Gamma.
    assert pace["worker-1"]["ps-1"] == pytest.approx(small / gamma, rel=1e-6)
    assert set(pace) == {"ps-0", "ps-1", "worker-0", "worker-1"}
    assert shards.shard_range(1001, 2, 0) == (0, 501)
    role = flowreport.role_flows(job)
    assert role["policy"] == "coflow"
    flowsection.check(role)  # what the roles will accept
