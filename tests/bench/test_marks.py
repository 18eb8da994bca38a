"""Two benches' whole main() with tailcut's runs faked (nothing built, nothing run):
each run's line carries its verdict and a ratio is "met" only when every run of both
transports was network-bound."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from bench import hostcheck
from tailcut.fidelity import verdict
from tailcut.runtime import local

BENCH = Path(__file__).resolve().parents[2] / "bench"
QUIET = {"host": {"wall_s": 2.0, "cores": 2, "busy": 0.1, "load1": 0.2},
         "processes": {"cpu_s": {"job": 0.0, "kernel": 0.0, "others": 0.0},
                       "share": {"job": 0.0, "kernel": 0.0, "others": 0.0},
                       "busiest_others": {}}}


def load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_runs(monkeypatch, verdicts):
    """local.run gives the jobs, in turn, a run with each of `verdicts` (cycling)."""
    seen = []

    def run(job, results_dir, progress=print, ahead=None):
        assert not (Path(results_dir) / "metrics.json").exists(), "a directory reused"
        Path(results_dir).mkdir(parents=True, exist_ok=True)
        fidelity = verdict.judge(host={**QUIET["host"], "busy": {
            "network-bound": 0.2, "marginal": 0.8, "host-bound": 0.95}[
                verdicts[len(seen) % len(verdicts)]]}, processes=QUIET["processes"])
        seen.append(str(results_dir))
        (Path(results_dir) / "metrics.json").write_text(json.dumps({"fidelity": fidelity}))
        (Path(results_dir) / "network.json").write_text("{}")
        return local.RunResult(job=job.name, results_dir=str(results_dir), converged=True,
                               jct_s=10.0 + len(seen), epochs=1, iterations=10,
                               final_accuracy=0.93, final_loss=0.1, fidelity=fidelity)

    monkeypatch.setattr(local, "run", run)
    monkeypatch.setattr(hostcheck, "measure", lambda seconds=2.0: QUIET)
    return seen


@pytest.mark.parametrize("verdicts, mark, network_bound", [
    (["network-bound"], "met", 4),
    (["network-bound", "host-bound"], "(tcp network-bound, bounded-loss host-bound)", 2),
])
def test_bl_quickstart_marks_its_ratio(monkeypatch, capsys, verdicts, mark, network_bound):
    bench = load("bl_quickstart")
    seen = fake_runs(monkeypatch, verdicts)
    monkeypatch.setattr(sys, "argv", ["bl_quickstart.py", "--runs", "2"])
    bench.main()
    out = capsys.readouterr().out
    assert len(seen) == 4
    ratio = [line for line in out.splitlines() if line.startswith("JCT(tcp) / ")]
    assert ratio and ratio[0].endswith(mark)
    assert out.count("target reached: True, network-bound (host 20% busy") == network_bound
    assert out.count("target reached: True, ") == 4


def test_bl_conditions_marks_every_condition_and_records_verdicts(monkeypatch, capsys,
                                                                  tmp_path):
    bench = load("bl_conditions")
    seen = fake_runs(monkeypatch, ["network-bound", "network-bound", "network-bound",
                                   "marginal"])
    monkeypatch.setattr(sys, "argv", ["bl_conditions.py", "--runs", "1", "--conditions",
                                      "clean", "loss-1%", "--json", str(tmp_path / "r.json")])
    bench.main()
    out = capsys.readouterr().out
    assert len(seen) == len(set(seen)) == 4
    rows = {line.split("|")[1].strip(): line.split("|")[-2].strip()
            for line in out.splitlines() if line.startswith("| clean") or
            line.startswith("| loss-1%")}
    assert rows == {"clean": "met",
                    "loss-1%": "(tcp network-bound, bounded-loss marginal)"}
    runs = json.loads((tmp_path / "r.json").read_text())["runs"]
    assert runs["loss-1%"]["bounded-loss"][0]["verdict"] == "marginal"
    assert runs["clean"]["tcp"][0]["host_busy"] == 0.2


def test_bl_conditions_rate_response_names_the_cell_whose_time_did_not_follow_the_rate(
        monkeypatch, capsys, tmp_path):
    """tcp's time per iteration doubles when the links' rate halves, bounded loss's does
    not move: both called network-bound, so bounded loss's verdict is the one named."""
    bench = load("bl_conditions")
    rates = []

    def run(job, results_dir, progress=print, ahead=None):
        Path(results_dir).mkdir(parents=True, exist_ok=True)
        rate = job.spec.network.access_link.bandwidth
        rates.append(rate)
        fidelity = verdict.judge(host=QUIET["host"], processes=QUIET["processes"])
        (Path(results_dir) / "metrics.json").write_text(json.dumps({"fidelity": fidelity}))
        (Path(results_dir) / "network.json").write_text("{}")
        jct = 20.0 * 200e6 / rate if job.spec.transport.type == "tcp" else 15.0
        return local.RunResult(job=job.name, results_dir=str(results_dir), converged=True,
                               jct_s=jct, epochs=1, iterations=100, final_accuracy=0.93,
                               final_loss=0.1, fidelity=fidelity)

    monkeypatch.setattr(local, "run", run)
    monkeypatch.setattr(hostcheck, "measure", lambda seconds=2.0: QUIET)
    monkeypatch.setattr(sys, "argv", ["bl_conditions.py", "--runs", "2", "--conditions",
                                      "clean", "--bandwidth", "200Mbit", "--rate-response",
                                      "--json", str(tmp_path / "r.json")])
    bench.main()
    out = capsys.readouterr().out
    assert rates == [200_000_000] * 4 + [100_000_000] * 2
    rows = [line for line in out.splitlines() if line.startswith("| clean | ")]
    assert rows[1:] == [
        "| clean | tcp | 200.0 | 400.0 | x2.00 of x2.00 proportional | network-bound "
        "| network-bound | yes |",
        "| clean | bounded-loss | 150.0 | 150.0 | x1.00 of x2.00 flat | network-bound "
        "| network-bound | **NO** |"]
    assert "1 of 2 cells disagree with the rate response" in out
    checks = json.loads((tmp_path / "r.json").read_text())["rate_response"]
    assert [c["agrees"] for c in checks] == [True, False]


def test_a_cells_marginal_runs_claim_nothing_and_any_disagreeing_run_is_named():
    bench = load("bl_conditions")
    assert bench.judged("flat", ["marginal", "marginal"]) is None
    assert bench.judged("flat", ["network-bound", "marginal"]) is False
    assert bench.judged("proportional", ["network-bound", "marginal"]) is True
    assert bench.judged("proportional", ["network-bound", "host-bound"]) is False
