"""`tailcut reproduce cadentflow --quick` end to end: the report's table holds the
numbers this run computed, read from the run's own files; a second run reuses the steps
and reads the files again (change one, and the report changes)."""

import csv
import json
import re
from pathlib import Path

import pytest

from tailcut import cli, papers

QUICK = ["reproduce", "cadentflow", "--quick", "--results-dir"]


def _report_rows(report: Path) -> dict[str, tuple[str, str]]:
    """result id -> (ours cell, ratio cell) from the report's comparison table."""
    rows = {}
    for line in report.read_text().splitlines():
        found = re.search(r"\[`([a-z0-9.\-]+)`\] \|", line)
        if found and line.startswith("|"):
            cells = [c.strip() for c in line.split(" | ")]
            rows[found.group(1)] = (cells[3], cells[4])
    return rows


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("reproduce")
    assert cli.main([*QUICK, str(out)]) == 0
    return out


def test_the_report_holds_the_numbers_this_run_computed(quick_run):
    paper_dir = quick_run / "cadentflow"
    report = paper_dir / "report.md"
    rows = _report_rows(report)
    assert set(rows) == {r.id for r in papers.load("cadentflow").results}

    toy = {r["variant"]: float(r["completion_s"])
           for r in _csv(paper_dir / "steps/sim-fig23/fig1-toy.csv")}
    inference = _csv(paper_dir / "steps/sim-fig23/fig3-inference.csv")
    coflow16 = max(float(r["coflow_vs_tcp"]) - 1 for r in inference
                   if r["model"] == "resnet-50" and r["workers"] == "16")
    shared = _csv(paper_dir / "steps/sim-fig4/fig4-shared.csv")
    coflow_shared = max(float(r["coflow_vs_alone"]) - 1 for r in shared
                        if r["model"] == "resnet-50")
    expected = {"fig1.coflow.completion-time": toy["coflow"],
                "fig1.objective-aware.completion-time": toy["cadentflow_priority"],
                "fig3.resnet-v1-101.coflow-vs-tcp": coflow16,
                "fig4.resnet-v2-50.coflow-vs-cadentflow-deadline": coflow_shared}
    paper = papers.load("cadentflow")
    for result_id, value in expected.items():
        ours, ratio = rows[result_id]
        assert float(ours.split()[0]) == pytest.approx(value, rel=5e-3), result_id
        assert float(ratio) == pytest.approx(value / paper.result(result_id).paper, rel=5e-3)
    assert rows["fig2.inception-v3.cct-flexibility"][0].startswith("—")

    comparison = {r["id"]: r for r in _csv(paper_dir / "comparison.csv")}
    ours = json.loads((paper_dir / "ours.json").read_text())
    for result_id, value in expected.items():
        assert float(comparison[result_id]["ours"]) == pytest.approx(value)
        assert ours[result_id]["value"] == pytest.approx(value)
        source_file = ours[result_id]["source"].split(":")[0]
        assert (paper_dir / source_file).exists(), source_file

    text = report.read_text()
    assert "tailcut simulate --models" in text                 # the exact commands
    assert "tailcut doctor" in text and "kernel " in text      # machine facts
    assert (quick_run / "environment" / "doctor.txt").read_text().strip()
    for png in re.findall(r"\]\(([^)]+\.png)\)", text):
        assert (paper_dir / png).stat().st_size > 0, png
    assert (quick_run / "index.md").exists()


def test_a_second_run_reuses_the_steps_and_reads_their_files_again(quick_run, capsys):
    paper_dir = quick_run / "cadentflow"
    toy_csv = paper_dir / "steps/sim-fig23/fig1-toy.csv"
    rows = _csv(toy_csv)
    for row in rows:   # as if the simulator had said 7 s: the report must follow the file
        if row["variant"] == "coflow":
            row["completion_s"] = "7.0"
    with open(toy_csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    capsys.readouterr()
    assert cli.main([*QUICK, str(quick_run)]) == 0
    printed = capsys.readouterr().out
    assert printed.count(": reused (finished") == 2
    ours, ratio = _report_rows(paper_dir / "report.md")["fig1.coflow.completion-time"]
    assert ours.startswith("7") and float(ratio) == pytest.approx(7.0 / 2.5, rel=1e-3)
