"""The per-tensor flow summary a run records: iteration time, phases, FCT per tensor."""

import csv

from tailcut.scheduling import flowreport
from tailcut.training import flows

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
