"""tailcut compare: the job's variants, spreads, the "met" rule, the busy-host refusal,
the interleaved runs (a fake runner) and the outputs; one real comparison (e2e)."""

import csv
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

from tailcut import spec
from tailcut.errors import SpecError, TailcutError
from tailcut.net import naming
from tailcut.runtime import compare
from tests.runtime.runs import nothing_of

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


def _job(**transport: Any) -> spec.TrainingJob:
    raw = yaml.safe_load(QUICKSTART.read_text())
    raw["spec"]["transport"] = {"type": "tcp", **transport}
    raw["spec"]["network"]["accessLink"]["bufferBytes"] = 85000
    return spec.from_dict(raw)


# --- variants ---------------------------------------------------------------------

def test_transports_are_parsed_and_wrong_ones_named_with_the_flag():
    assert compare.parse_transports(" tcp, bounded-loss ") == ["tcp", "bounded-loss"]
    for text, words in (("tcp,quic", ["--transports", "'quic'", "known: tcp"]),
                        ("tcp,tcp", ["tcp named twice"]),
                        ("tcp", ["at least 2"])):
        with pytest.raises(SpecError) as err:
            compare.parse_transports(text)
        assert all(w in str(err.value) for w in words), str(err.value)
    assert compare.parse_transports("udp", least=1) == ["udp"]


def test_a_variant_changes_only_the_transport_and_the_name():
    job = _job()
    bl = compare.variant(job, "bounded-loss", "quickstart-bl1")
    assert bl.name == "quickstart-bl1"
    assert bl.spec.transport.type == "bounded-loss" and bl.spec.transport.p == compare.DEFAULT_P
    assert bl.spec.model_copy(update={"transport": job.spec.transport}) == job.spec
    assert compare.variant(job, "tcp", "x").spec == job.spec


def test_a_variant_keeps_the_jobs_transport_settings_where_they_apply():
    bl = _job(type="bounded-loss", p=0.8, minP=0.7, rateMbit=500.0)
    tcp = compare.variant(bl, "tcp", "a").spec.transport
    assert (tcp.p, tcp.min_p, tcp.rate_mbit) == (None, None, None)
    udp = compare.variant(bl, "udp", "b").spec.transport
    assert udp.rate_mbit == 500.0 and udp.p is None
    again = compare.variant(bl, "bounded-loss", "c").spec.transport
    assert (again.p, again.min_p, again.rate_mbit) == (0.8, 0.7, 500.0)
    cubic = _job(tcpCongestionControl="cubic")
    assert compare.variant(cubic, "tcp", "d").spec.transport.tcp_congestion_control == "cubic"
    assert compare.variant(cubic, "bounded-loss", "e").spec.transport \
        .tcp_congestion_control is None


def test_bandwidth_sets_both_link_kinds_and_keeps_their_other_fields():
    v = compare.variant(_job(), "tcp", "x", bandwidth_bit=200 * 10**6)
    net = v.spec.network
    assert net.access_link.bandwidth == net.uplink.bandwidth == 200 * 10**6
    assert net.access_link.buffer_bytes == 85000


def test_a_transport_the_job_cannot_run_over_is_refused_naming_the_flag():
    job = spec.load_file(ROOT / "examples" / "in-network.yaml")
    with pytest.raises(SpecError) as err:
        compare.variant(job, "bounded-loss", "x")
    assert "--transports bounded-loss" in str(err.value)
    assert "inNetwork" in str(err.value)


def test_run_names_are_unique_dns_labels_of_at_most_40_characters():
    base = "a-very-long-job-name-that-fills-forty-c"
    names = {compare.run_name(base, t, i) for t in ("tcp", "bounded-loss") for i in (1, 2, 10)}
    assert len(names) == 6
    assert all(naming.valid_job_name(n) and len(n) <= 40 for n in names), names
    assert compare.run_name("quickstart", "bounded-loss", 2) == "quickstart-bl2"


def test_the_condition_names_rates_buffers_and_background_load():
    job = spec.load_file(ROOT / "examples" / "quickstart-background.yaml")
    said = compare.condition(compare.variant(job, "tcp", "x", bandwidth_bit=10**8))
    assert said.startswith("access 100Mbit, uplink 100Mbit")
    assert "background load 0.5 on uplink/rack-1" in said
    assert "access buffer 85 KB" in compare.condition(_job())


# --- what the runs add up to ---------------------------------------------------------

def _run(transport: str, jct: Optional[float], judged: Optional[str] = "network-bound",
         run: int = 1, state: str = "finished", accuracy: float = 0.93) -> compare.Run:
    return compare.Run(order=0, run=run, transport=transport, job="j", results_dir="d",
                       state=state, jct_s=jct, final_accuracy=accuracy, verdict=judged)


def test_spread_gives_median_range_and_quartiles():
    s = compare.spread([3.0, 1.0, 2.0, 10.0])
    assert (s["n"], s["median"], s["min"], s["max"]) == (4, 2.5, 1.0, 10.0)
    assert (s["q1"], s["q3"]) == (1.75, 4.75)
    assert compare.spread([4.0])["q1"] == compare.spread([4.0])["q3"] == 4.0
    assert compare.spread([])["median"] is None


def test_a_ratio_is_met_only_when_every_run_of_both_was_network_bound():
    good = [_run("tcp", 1.0), _run("tcp", 1.1, run=2)]
    other = [_run("bounded-loss", 2.0)]
    assert compare.met(good, other)
    assert not compare.met(good, [*other, _run("bounded-loss", 2.0, "marginal", 2)])
    assert not compare.met(good, [*other, _run("bounded-loss", None, None, 2, "failed")])
    assert not compare.met(good, [_run("bounded-loss", 2.0, None)])
    assert compare.verdicts([_run("tcp", 2.0, None), *good]) == "2 network-bound, 1 no verdict"
    assert not compare.met(good, [])


def test_the_summary_gives_medians_and_marks_a_ratio_with_the_verdicts():
    runs = [_run("tcp", 10.0), _run("bounded-loss", 4.0), _run("tcp", 12.0, run=2),
            _run("bounded-loss", 6.0, "host-bound", run=2),
            _run("tcp", None, None, 3, "failed")]
    s = compare.summarize(runs, ["tcp", "bounded-loss"])
    tcp = s["transports"]["tcp"]
    assert tcp["jct_s"]["median"] == 11.0 and tcp["runs"] == 3 and tcp["failed"] == 1
    assert tcp["verdicts"] == "2 network-bound, 1 failed"
    (ratio,) = s["ratios"]
    assert ratio["ratio"] == pytest.approx(11.0 / 5.0) and not ratio["met"]
    assert ratio["mark"] == ("not met: tcp 2 network-bound, 1 failed; bounded-loss "
                             "1 network-bound, 1 host-bound")
    text = compare.table(s)
    assert "JCT(tcp) / JCT(bounded-loss), medians: 2.20 (not met:" in text
    assert "11.00 s" in text and "10.00-12.00 s" in text and "2+1F" in text


def test_every_runs_jct_and_verdict_are_listed_run_by_run():
    runs = [_run("tcp", 10.0), _run("bounded-loss", 4.0, "host-bound"),
            _run("tcp", 12.0, "marginal", run=2),
            _run("bounded-loss", None, None, 2, "failed")]
    head, first, second = compare.run_table(runs, ["tcp", "bounded-loss"]).splitlines()
    assert head.split() == ["run", "tcp", "bounded-loss"]
    assert first.split() == ["1", "10.00", "s", "network-bound", "4.00", "s", "host-bound"]
    assert second.split() == ["2", "12.00", "s", "marginal", "FAILED"]
    assert first.index("4.00") == head.index("bounded-loss")


def test_a_transport_whose_runs_all_failed_gives_no_ratio():
    s = compare.summarize([_run("tcp", 1.0), _run("udp", None, None, state="failed")],
                          ["tcp", "udp"])
    assert s["ratios"][0]["ratio"] is None and not s["ratios"][0]["met"]
    assert "medians: n/a" in compare.table(s)


@dataclass
class _Result:
    jct_s: float
    final_accuracy: float = 0.9
    converged: bool = True
    iterations: int = 10
    fidelity: Optional[dict[str, Any]] = None


def test_runs_are_interleaved_each_in_its_own_directory_and_a_failure_does_not_stop_them(
        tmp_path):
    job = _job()
    variants = {t: [compare.variant(job, t, compare.run_name("q", t, i)) for i in (1, 2)]
                for t in ("tcp", "bounded-loss")}
    made: list[tuple[str, Path]] = []

    def runner(j, out, progress):
        made.append((j.name, out))
        progress(f"line of {j.name}")
        if j.name == "q-bl1":
            raise TailcutError("worker-1 exited with code 1")
        return _Result(jct_s=float(len(made)), fidelity={"verdict": "marginal",
                                                         "reasons": ["r"]})
    said: list[str] = []
    seen: list[int] = []
    runs = compare.execute(variants, tmp_path, said.append, runner,
                           on_run=lambda so_far: seen.append(len(so_far)))
    assert [name for name, _ in made] == ["q-tcp1", "q-bl1", "q-tcp2", "q-bl2"]
    assert [out.name for _, out in made] == ["run1-tcp", "run1-bounded-loss", "run2-tcp",
                                             "run2-bounded-loss"]
    assert seen == [1, 2, 3, 4]
    assert [r.state for r in runs] == ["finished", "failed", "finished", "finished"]
    assert runs[1].error == "worker-1 exited with code 1" and runs[1].jct_s is None
    assert runs[2].verdict == "marginal" and runs[2].jct_s == 3.0
    assert (tmp_path / "run2-tcp" / "progress.log").read_text() == "line of q-tcp2\n"
    assert any("bounded-loss run 1: FAILED, not counted: worker-1" in s for s in said)
    assert sum("[" in s and "tcp run" in s for s in said) == 4


def test_a_run_short_of_its_target_is_marked(tmp_path):
    variants = {"tcp": [compare.variant(_job(), "tcp", "q-tcp1")]}
    runs = compare.execute(variants, tmp_path, lambda _: None,
                           lambda j, o, p: _Result(jct_s=1.0, converged=False))
    assert runs[0].state == "target-not-reached"


def test_the_files_hold_every_run(tmp_path):
    runs = [_run("tcp", 10.0), _run("bounded-loss", None, None, state="failed")]
    runs[0].reasons = ["a", "b"]
    compare.write(tmp_path, {"runs": len(runs)}, runs)
    rows = list(csv.DictReader((tmp_path / "compare.csv").open()))
    assert [r["transport"] for r in rows] == ["tcp", "bounded-loss"]
    assert rows[0]["reasons"] == "a; b" and rows[1]["jct_s"] == ""
    assert json.loads((tmp_path / "compare.json").read_text()) == {"runs": 2}


def test_the_figure_has_units_a_whole_title_and_a_legend_off_its_runs(tmp_path):
    from tests.reports.figure_checks import check_figure
    runs = [_run("tcp", 10.0), _run("bounded-loss", 4.0, "host-bound"),
            _run("tcp", 12.0, "marginal", run=2), _run("bounded-loss", 4.5, run=2)]
    title = ("quickstart-background: JCT per run, access 200Mbit, uplink 200Mbit, "
             "background load 0.5 on uplink/rack-1; 2 interleaved run(s) per transport")
    fig = compare.draw(runs, ["tcp", "bounded-loss"], title)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "job completion time (s)" and ax.get_xlabel() == "transport"
    assert fig.get_suptitle().replace("\n", " ") == title
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] > 12.0
    legend = ax.get_legend() or fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == [
        "network-bound run", "marginal run", "host-bound run", "median JCT"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["tcp", "bounded-loss"]
    try:
        check_figure(fig, unitless={"transport"})   # the title whole, the legend off the runs
    finally:
        import matplotlib.pyplot as plt
        plt.close(fig)
    path = compare.plot(runs, ["tcp", "bounded-loss"], "t", tmp_path / "c.png")
    assert path.stat().st_size > 10_000


# --- the host before ------------------------------------------------------------

def _reading(others: float, busiest: Optional[dict[str, float]] = None) -> dict[str, Any]:
    return {"host": {"wall_s": 2.0, "cores": 2, "busy": 0.8, "softirq": 0.0, "steal": 0.0,
                     "psi_some": 0.1, "load1": 3.1},
            "processes": {"cpu_s": {"job": 0.0, "kernel": 0.0, "others": others * 4},
                          "share": {"job": 0.0, "kernel": 0.0, "others": others},
                          "busiest_others": busiest or {}}}


def test_a_host_whose_other_processes_take_more_than_the_margin_is_refused():
    limit = compare.verdict.THRESHOLDS["others_cpu"][0]
    assert compare.busy_refusal(_reading(limit)) is None
    why = compare.busy_refusal(_reading(0.4, {"cc1": 1.2, "make": 0.3}))
    assert why is not None
    assert "other processes took 40% of its 2 cores over 2.0 s" in why
    assert "busiest: cc1 1.2 s, make 0.3 s" in why and f"{limit:.0%}" in why
    with pytest.raises(compare.HostBusy) as err:
        compare.check_host(False, print, measure=lambda: _reading(0.4, {"cc1": 1.2}))
    assert "--allow-busy" in str(err.value) and "cc1 1.2 s" in str(err.value)


def test_allow_busy_runs_anyway_and_records_the_reading():
    said: list[str] = []
    state = compare.check_host(True, said.append, measure=lambda: _reading(0.4))
    assert state["allowed_busy"] and "40%" in state["refusal"]
    assert state["processes"]["share"]["others"] == 0.4
    assert said and said[0].startswith("warning: the host is busy") and "--allow-busy" in said[0]
    quiet = compare.check_host(False, said.append, measure=lambda: _reading(0.0))
    assert quiet["refusal"] is None and said[-1].startswith("host before:")


def test_the_host_is_measured_over_the_window_given():
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)
    state = compare.measure_host(0.3, sleep=sleep)
    assert slept == [0.3]
    assert state["host"]["wall_s"] >= 0.3 and state["host"]["cores"] >= 1
    assert set(state["processes"]["share"]) == {"job", "kernel", "others"}


def test_the_help_lists_compare_and_calibrate():
    done = subprocess.run([sys.executable, "-m", "tailcut.cli", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert "compare " in done.stdout and "calibrate " in done.stdout


def test_a_wrong_flag_is_named_before_anything_runs(tmp_path):
    for flags, words in ((["--transports", "tcp,quic"], "--transports 'tcp,quic'"),
                         (["--transports", "tcp,udp", "--runs", "0"], "--runs 0"),
                         (["--transports", "tcp,udp", "--bandwidth", "100mbps"],
                          "--bandwidth: '100mbps' is ambiguous")):
        done = subprocess.run([sys.executable, "-m", "tailcut.cli", "compare",
                               str(QUICKSTART), *flags, "--results-dir", str(tmp_path)],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and words in done.stderr, done.stderr
    assert not any(tmp_path.iterdir())


# --- one real comparison ------------------------------------------------------------

@pytest.mark.netns
@pytest.mark.e2e
def test_a_small_comparison_runs_both_transports_and_writes_its_table_and_files(tmp_path):
    raw = yaml.safe_load(QUICKSTART.read_text())
    raw["metadata"]["name"] = "cmpe2e"
    raw["spec"]["training"].update({"iterations": 20, "timeoutS": 60})
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "tailcut.cli", "compare", str(job_file),
                           "--transports", "tcp,bounded-loss", "--runs", "1",
                           "--bandwidth", "200Mbit", "--results-dir", str(out),
                           "--allow-busy"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("[1/2] tcp run 1: JCT") and "(target not reached)" in line
               for line in lines)
    assert any(line.startswith("[2/2] bounded-loss run 1: JCT") for line in lines)
    head = lines.index(next(line for line in lines if line.startswith("transport ")))
    assert lines[head + 1].startswith("tcp ") and lines[head + 2].startswith("bounded-loss ")
    assert lines[head + 3].startswith("JCT(tcp) / JCT(bounded-loss), medians: ")
    per_run = lines.index(next(line for line in lines if line.startswith("run  tcp")))
    assert lines[per_run + 1].startswith("1    ") and lines[per_run + 1].count(" s ") == 2
    document = json.loads((out / "compare.json").read_text())
    assert document["transport_settings"]["bounded-loss"]["p"] == compare.DEFAULT_P
    assert document["host_before"]["allowed_busy"] is True
    assert "others" in document["host_before"]["processes"]["share"]
    assert [r["job"] for r in document["runs"]] == ["cmpe2e-tcp1", "cmpe2e-bl1"]
    for r in document["runs"]:
        # 20 iterations are short of the quickstart's target accuracy: a result all the same
        assert r["state"] == "target-not-reached" and r["iterations"] == 20
        assert r["verdict"] in compare.verdict.VERDICTS
        metrics = json.loads((Path(r["results_dir"]) / "metrics.json").read_text())
        assert metrics["fidelity"]["verdict"] == r["verdict"]
        assert spec.load_file(Path(r["results_dir"]) / "spec.yaml").spec.network \
            .uplink.bandwidth == 200 * 10**6
    assert len(list(csv.DictReader((out / "compare.csv").open()))) == 2
    assert (out / "compare.png").stat().st_size > 10_000
    nothing_of("cmpe2e-tcp1")
    nothing_of("cmpe2e-bl1")
