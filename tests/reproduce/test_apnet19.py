"""apnet19's testbed: the coin-flip and the congestion condition's jobs, and the report's
rows read from the files their runs leave (written here by hand: no job runs)."""

import json
from pathlib import Path

import pytest
import yaml

from tailcut import papers, spec
from tailcut.reproduce import apnet19, report
from tailcut.reproduce.measure import Files


def _jobs(quick: bool, prefix: str) -> dict[str, spec.TrainingJob]:
    return {s.name: spec.from_dict(yaml.safe_load(s.job)) for s in apnet19.steps(quick)
            if s.name.startswith(f"{prefix}-")}


def test_the_congestion_runs_have_background_load_and_shallow_buffers_and_no_random_loss():
    congestion = _jobs(False, "congestion")
    assert list(congestion) == [f"congestion-{t}-r{r}" for r in (1, 2, 3) for t in ("tcp", "bl")]
    for name, job in congestion.items():
        network = job.spec.network
        for link in (network.access_link, network.uplink):
            assert link.buffer_bytes == 85_000 and not link.loss, name
        load = job.spec.background_load
        assert load is not None and load.target.load_factor == 0.5
        assert load.target.link == "uplink/rack-1" and load.receivers == ["ps-0"]
        assert job.spec.training.target_accuracy == 0.93
    assert congestion["congestion-bl-r2"].spec.transport.type == "bounded-loss"
    assert congestion["congestion-bl-r2"].spec.transport.p == 0.9
    assert congestion["congestion-tcp-r2"].spec.transport.type == "tcp"


def test_the_coin_flip_runs_keep_their_names_and_jobs_so_earlier_results_are_reused():
    for name, job in _jobs(False, "run").items():
        assert job.name == f"repro-apnet19-{name[len('run-'):]}"
        assert job.spec.network.access_link.loss == 0.01
        assert job.spec.network.access_link.buffer_bytes is None
        assert job.spec.background_load is None


def test_quick_runs_each_condition_once_capped_at_a_few_iterations():
    quick = {**_jobs(True, "run"), **_jobs(True, "congestion"), **_jobs(True, "incast")}
    assert sorted(quick) == ["congestion-bl-r1", "congestion-tcp-r1", "incast-bl-r1",
                             "incast-tcp-r1", "run-bl-r1", "run-tcp-r1"]
    for job in quick.values():
        assert job.spec.training.iterations == apnet19.QUICK_ITERATIONS
        assert job.spec.training.target_accuracy is None
    assert quick["congestion-tcp-r1"].spec.background_load is not None


def test_each_run_is_its_own_step_that_needs_its_metrics_to_count_as_finished():
    plan = [s for s in apnet19.steps(False)
            if s.job is not None and not s.name.startswith("gloo-")]   # test_gloo.py
    assert len({s.name for s in plan}) == len({s.job for s in plan}) == len(plan) == 18
    assert all(s.needs_root and s.outputs == ("results/metrics.json",) for s in plan)


def _write(paper_dir: Path, step: str, transport: str, jct_s: float, accuracy: float,
           retrans: int, rtos: int, drops: int, load: float | None,
           verdict: str = "network-bound") -> None:
    results = paper_dir / "steps" / step / "results"
    results.mkdir(parents=True)
    (results / "metrics.json").write_text(json.dumps({
        "transport": transport, "jct_s": jct_s, "epochs": 2, "iterations": 300,
        "final_accuracy": accuracy, "converged": True, "tcp_retrans_segs": retrans,
        "tcp_rto_timeouts": rtos, "fidelity": {"verdict": verdict}}))
    (results / "network.json").write_text(json.dumps(
        {"queue_drops": {"total": drops, "by_link_end": {}}}))
    if load is not None:
        (results / "background").mkdir()
        (results / "background" / "background.json").write_text(
            json.dumps({"measured_load_factor": load}))


def test_the_congestion_row_holds_the_medians_of_its_runs_next_to_the_papers_range(tmp_path):
    tcp = [(9.0, 0.941, 120, 3, 400), (12.0, 0.935, 90, 5, 380), (30.0, 0.938, 300, 9, 700)]
    bl = [(7.0, 0.931, 4, 0, 150), (6.0, 0.933, 6, 1, 210), (8.0, 0.936, 2, 0, 90)]
    for r in range(3):
        _write(tmp_path, f"congestion-tcp-r{r + 1}", "tcp", *tcp[r], load=0.5 + r / 100)
        _write(tmp_path, f"congestion-bl-r{r + 1}", "bounded-loss", *bl[r], load=0.45,
               verdict="marginal" if r == 2 else "network-bound")
    # the coin-flip condition: one pair only (its other runs failed)
    _write(tmp_path, "run-tcp-r1", "tcp", 20.0, 0.94, 500, 40, 0, load=None)
    _write(tmp_path, "run-bl-r1", "bounded-loss", 5.0, 0.93, 1, 0, 0, load=None)

    m = apnet19.measure(Files(tmp_path), quick=False)

    speedup = 12.0 / 7.0   # medians, not means: one slow tcp run does not move it
    rows = {r["id"]: r for r in report.comparison(papers.load("apnet19"), m)}
    for end, paper in (("min", 1.1), ("max", 2.2)):
        row = rows[f"speedup.congestion.{end}"]
        assert row["paper"] == paper == papers.load("apnet19").result(f"speedup.{end}").paper
        assert row["ours"] == pytest.approx(speedup)
        assert row["ours_over_paper"] == pytest.approx(speedup / paper, abs=1e-4)
        assert "congestion-tcp-r2/results/metrics.json: jct_s" in row["source"]
    values = {k: v.value for k, v in m.values.items()}
    assert values["testbed.congestion.accuracy.tcp"] == pytest.approx(0.938)
    assert values["testbed.congestion.tcp_retrans_segs.tcp"] == 120
    assert values["testbed.congestion.tcp_rto_timeouts.bl"] == 0
    assert values["testbed.congestion.queue_drops.tcp"] == 400
    assert values["testbed.congestion.load_factor.tcp"] == pytest.approx(0.51)
    assert values["testbed.loss.speedup"] == pytest.approx(4.0)
    assert values["testbed.loss.load_factor.tcp"] is None

    title, table = next(t for t in m.tables if t[0].startswith("The testbed"))
    by_condition = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()
                    if line.startswith("| co")}
    congestion = by_condition["congestion: background 0.5, 85 KB buffers"]
    cells = [c.strip() for c in congestion.strip("|").split("|")]
    assert cells[1:6] == ["3 / 3", "12", "7", f"**{speedup:.2f}**", "1.1-2.2x (Sec. 3.1)"]
    assert cells[6:] == ["0.938", "0.933", "120 / 4", "5 / 0", "400 / 150", "0.51 / 0.45",
                         "1 marginal, 5 network-bound"]
    coin_flip = [c.strip() for c in by_condition["coin-flip: 1% random loss"].split("|")[1:-1]]
    assert coin_flip[1:6] == ["1 / 1", "20", "5", "**4**", "—"]
    assert coin_flip[-2:] == ["— / —", "2 network-bound"]   # no load factor; verdicts
    assert table.count("| congestion-") == 6 and table.count("| run-") == 2   # by run


def test_missing_runs_leave_the_congestion_numbers_unmeasured_not_zero(tmp_path):
    _write(tmp_path, "congestion-tcp-r1", "tcp", 9.0, 0.94, 120, 3, 400, load=0.5)
    m = apnet19.measure(Files(tmp_path), quick=True)   # congestion-bl-r1 failed
    rows = {r["id"]: r for r in report.comparison(papers.load("apnet19"), m)}
    assert rows["speedup.congestion.min"]["ours"] is None
    assert m.values["testbed.congestion.jct_s.tcp"].value == 9.0
    assert m.values["testbed.congestion.jct_s.bl"].value is None
    table = next(t for title, t in m.tables if title.startswith("The testbed"))
    assert "iterations a run (--quick)" in table


def test_a_background_short_of_its_load_factor_is_said_next_to_the_speedup(tmp_path):
    _write(tmp_path, "congestion-tcp-r1", "tcp", 12.0, 0.66, 191, 0, 0, load=0.16)
    _write(tmp_path, "congestion-bl-r1", "bounded-loss", 34.3, 0.67, 6, 0, 0, load=0.45)
    m = apnet19.measure(Files(tmp_path), quick=True)
    note = m.values["speedup.congestion.max"].note
    assert "reached only tcp 0.16 of its 0.5" in note and "bl" not in note.split("only")[1]
    assert any("fell short" in n for n in m.notes)


def test_a_background_short_of_its_load_keeps_the_congestion_headline_from_counting(
        tmp_path):
    for r in range(3):
        _write(tmp_path, f"congestion-tcp-r{r + 1}", "tcp", 12.0, 0.94, 9, 1, 40, load=0.5)
        _write(tmp_path, f"congestion-bl-r{r + 1}", "bounded-loss", 6.0, 0.93, 1, 0, 9,
               load=0.2)
    m = apnet19.measure(Files(tmp_path), quick=False)
    speed = m.values["speedup.congestion.min"]
    assert speed.value == pytest.approx(2.0)
    assert speed.verdicts == "6 network-bound, background short in 1 transport(s)"
    (claim,) = report.headlines(papers.load("apnet19"), m)
    assert claim["status"] == report.NOT_REPRODUCED


def test_the_incast_runs_put_eight_workers_and_the_ps_in_one_rack_on_shallow_buffers():
    incast = _jobs(False, "incast")
    assert list(incast) == [f"incast-{t}-r{r}" for r in (1, 2, 3) for t in ("tcp", "bl")]
    for name, job in incast.items():
        network = job.spec.network
        assert [r.name for r in network.racks] == ["rack-0"], name
        assert set(network.placement.values()) == {"rack-0"} and len(network.placement) == 9
        assert network.access_link.buffer_bytes == network.uplink.buffer_bytes == 85_000
        assert not network.access_link.loss and job.spec.background_load is None


def test_every_pair_that_compares_the_transports_runs_at_the_comparison_rate():
    for prefix in ("run", "congestion", "incast"):
        for name, job in _jobs(False, prefix).items():
            network = job.spec.network
            assert network.access_link.bandwidth == network.uplink.bandwidth == 200_000_000, name


def _messages(results: Path, kind: str, completions: dict[int, list[float]]) -> None:
    name = "messages.csv" if kind == "PUSH" else "messages-worker-0.csv"
    lines = ["iteration,kind,completion_s"] + [
        f"{i},{kind},{c}" for i, values in completions.items() for c in values]
    (results / name).write_text("\n".join(lines) + "\n")


def test_table_1_comes_from_the_congestion_runs_tails_not_the_random_loss_runs(tmp_path):
    """Only the congestion tcp run's pushes have a tail (0.4 s over a 0.1 s mean in one
    iteration): the slowdown is 10 / (10 - 0.3), and the loss run's bigger tail is not
    read."""
    _write(tmp_path, "congestion-tcp-r1", "tcp", 10.0, 0.93, 1, 0, 5, load=0.5)
    _write(tmp_path, "run-tcp-r1", "tcp", 10.0, 0.93, 1, 0, 0, load=None)
    congestion = tmp_path / "steps" / "congestion-tcp-r1" / "results"
    _messages(congestion, "PUSH", {0: [0.0, 0.0, 0.0, 0.4], 1: [0.1, 0.1, 0.1, 0.1]})
    _messages(congestion, "PARAMS", {0: [0.1], 1: [0.1]})
    loss = tmp_path / "steps" / "run-tcp-r1" / "results"
    _messages(loss, "PUSH", {0: [0.0, 0.0, 0.0, 4.0]})
    m = apnet19.measure(Files(tmp_path), quick=True)
    slowdown = m.values["table1.mlp.slowdown"]
    assert slowdown.value == pytest.approx(10.0 / (10.0 - 0.3))
    assert "congestion-tcp-r1" in slowdown.source and "run-tcp-r1" not in slowdown.source
    assert slowdown.verdicts == "1 network-bound"


def test_the_report_says_what_the_testbed_lacks_with_this_hosts_congestion_controls(
        tmp_path) -> None:
    from tailcut.reproduce import apnet19
    (tmp_path / "tcp_congestion_control").write_text("cubic\n")
    (tmp_path / "tcp_available_congestion_control").write_text("reno cubic\n")
    said = apnet19.testbed_lacks(tmp_path)
    assert "no ECN marking" in said and "no dctcp (it offers reno cubic)" in said
    assert "default, cubic" in said and "favours bounded loss" in said
    (tmp_path / "tcp_available_congestion_control").write_text("reno cubic dctcp\n")
    assert "has dctcp, but nothing marks ECN" in apnet19.testbed_lacks(tmp_path)
