"""tailcut calibrate: rates, probe jobs, the iterations a probe gets, the rate-response
factor, the highest network-bound rates, the snippet and the table; one real
calibration at two rates (e2e)."""

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

from tailcut import spec
from tailcut.errors import SpecError, TailcutError
from tailcut.net import naming
from tailcut.runtime import calibrate
from tests.runtime.runs import nothing_of

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
M = 10**6


def _job() -> spec.TrainingJob:
    raw = yaml.safe_load(QUICKSTART.read_text())
    raw["spec"]["network"]["uplink"]["bufferBytes"] = 85000
    return spec.from_dict(raw)


def test_rates_are_probed_highest_first_each_once():
    assert calibrate.parse_rates("100Mbit, 1Gbit,200Mbit,100Mbit") == [10**9, 200 * M,
                                                                      100 * M]
    with pytest.raises(SpecError) as err:
        calibrate.parse_rates("1Gbit,100mbps")
    assert "--rates '1Gbit,100mbps'" in str(err.value) and "ambiguous" in str(err.value)
    with pytest.raises(SpecError, match="--rates ',': name at least one rate"):
        calibrate.parse_rates(",")


def test_a_probe_trains_a_fixed_number_of_iterations_at_the_rate_without_a_target():
    job = _job()
    probe = calibrate.probe_job(job, "bounded-loss", 50 * M, 120, 3)
    t, net = probe.spec.training, probe.spec.network
    assert (t.iterations, t.target_accuracy) == (120, None)
    assert t.timeout_s == min(job.spec.training.timeout_s, calibrate.PROBE_TIMEOUT_S)
    assert net.access_link.bandwidth == net.uplink.bandwidth == 50 * M
    assert net.uplink.buffer_bytes == 85000
    assert probe.spec.transport.type == "bounded-loss" and probe.spec.transport.p == 0.9
    assert probe.name == "quickstart-calbl3" and naming.valid_job_name(probe.name)
    assert t.model_copy(update={"iterations": None, "target_accuracy": 0.93,
                                "timeout_s": job.spec.training.timeout_s}) \
        == job.spec.training


def test_the_next_probe_gets_the_iterations_that_fit_if_time_grows_with_the_rates_fall():
    # 10 ms an iteration at 1 Gbit/s: 20 ms predicted at 500 Mbit/s, 750 in 15 s
    assert calibrate.next_iterations(0.010, 10**9, 500 * M, 200) == 750
    assert calibrate.next_iterations(10.0, 10**9, 50 * M, 200) == calibrate.MIN_ITERATIONS
    assert calibrate.next_iterations(1e-6, 10**9, 500 * M, 200) == calibrate.MAX_ITERATIONS
    assert calibrate.next_iterations(None, 10**9, 500 * M, 321) == 321   # it failed


def _probe(transport: str, rate: int, s_per_it: Optional[float],
           judged: Optional[str] = "network-bound") -> calibrate.Probe:
    return calibrate.Probe(transport=transport, rate_bit=rate, rate=f"{rate // M}Mbit",
                           job="j", results_dir="d", iterations=100,
                           state="finished" if s_per_it else "failed",
                           jct_s=None if s_per_it is None else s_per_it * 100,
                           iterations_run=None if s_per_it is None else 100,
                           s_per_iteration=s_per_it, verdict=judged,
                           error=None if s_per_it else "worker-0 exited with code 1\nmore")


def test_the_rate_response_factor_is_the_growth_of_time_per_iteration_against_the_rates():
    hi, lo = _probe("tcp", 200 * M, 0.05), _probe("tcp", 100 * M, 0.095)
    r = calibrate.response(hi, lo)
    assert (r["growth"], r["expected"], r["from"], r["to"]) == (1.9, 2.0, "200Mbit",
                                                                 "100Mbit")
    assert r["elasticity"] == pytest.approx(0.926, abs=1e-3)
    assert r["response"] == "proportional"
    assert calibrate.response(hi, _probe("tcp", 100 * M, 0.052))["response"] == "flat"
    assert calibrate.response(hi, _probe("tcp", 100 * M, 0.07))["response"] == "partial"
    # 1 Gbit/s to 200 Mbit/s: a factor of 5 expected
    assert calibrate.response(_probe("udp", 1000 * M, 0.01),
                              _probe("udp", 200 * M, 0.05))["elasticity"] == 1.0


def test_a_response_agrees_with_the_verdicts_or_is_named():
    nb, hb = "network-bound", "host-bound"
    flat = calibrate.response(_probe("tcp", 200 * M, 0.05, nb), _probe("tcp", 100 * M, 0.05, nb))
    assert flat["agrees"] is False and flat["verdicts"] == [nb, nb]
    grows = calibrate.response(_probe("tcp", 200 * M, 0.05, hb),
                               _probe("tcp", 100 * M, 0.1, hb))
    assert grows["agrees"] is False
    assert calibrate.disagreements([flat, grows]) == [
        "tcp 200Mbit -> 100Mbit: time per iteration x1.00 of x2.00 (flat), yet "
        "network-bound at 200Mbit",
        "tcp 200Mbit -> 100Mbit: time per iteration x2.00 of x2.00 (proportional), yet "
        "host-bound at 200Mbit"]
    assert calibrate.agrees("proportional", nb) and calibrate.agrees("flat", hb)
    assert calibrate.agrees("partial", nb) and calibrate.agrees("partial", hb)
    assert calibrate.agrees("flat", "marginal") is None and calibrate.agrees("flat", None) is None
    # the verdict at the lower rate does not enter: host-bound at 200 Mbit/s and
    # network-bound at 100, a time that grew in proportion still disagrees
    assert calibrate.response(_probe("tcp", 200 * M, 0.05, hb),
                              _probe("tcp", 100 * M, 0.1, nb))["agrees"] is False
    assert calibrate.disagreements([calibrate.response(_probe("tcp", 200 * M, 0.05, nb),
                                                       _probe("tcp", 100 * M, 0.1, nb))]) == []


def test_responses_pair_consecutive_finished_probes_of_each_transport():
    probes = [_probe("tcp", 400 * M, 0.01), _probe("udp", 400 * M, 0.01),
              _probe("tcp", 200 * M, None), _probe("udp", 200 * M, 0.02),
              _probe("tcp", 100 * M, 0.04)]
    pairs = [(r["transport"], r["from"], r["to"]) for r in calibrate.responses(probes)]
    assert pairs == [("tcp", "400Mbit", "100Mbit"), ("udp", "400Mbit", "200Mbit")]


def test_the_highest_network_bound_rate_per_transport_and_for_all_of_them():
    probes = [_probe("tcp", 400 * M, 0.01, "host-bound"), _probe("bl", 400 * M, 0.01),
              _probe("tcp", 200 * M, 0.02), _probe("bl", 200 * M, 0.02, "marginal"),
              _probe("tcp", 100 * M, 0.04), _probe("bl", 100 * M, 0.04)]
    assert calibrate.highest(probes, ["tcp", "bl"]) == {
        "each": {"tcp": 200 * M, "bl": 400 * M}, "all": 100 * M}
    assert calibrate.highest(probes[:2], ["tcp", "bl"]) == {
        "each": {"tcp": None, "bl": 400 * M}, "all": None}
    assert calibrate.highest([_probe("tcp", 400 * M, None)], ["tcp"])["each"]["tcp"] is None


def test_the_snippet_sets_both_links_rate_and_keeps_their_other_fields():
    text = calibrate.snippet(_job(), 200 * M, ["tcp", "bounded-loss"])
    first, *_ = text.splitlines()
    assert first.startswith("#") and "tcp and bounded-loss were network-bound" in first
    assert yaml.safe_load(text) == {"spec": {"network": {
        "accessLink": {"bandwidth": "200Mbit"},
        "uplink": {"bufferBytes": 85000, "bandwidth": "200Mbit"}}}}
    assert "was network-bound" in calibrate.snippet(_job(), M, ["tcp"])


def test_the_table_gives_each_probe_its_growth_and_verdict():
    probes = [_probe("tcp", 200 * M, 0.05, "host-bound"), _probe("tcp", 100 * M, 0.095),
              _probe("udp", 100 * M, None)]
    text = calibrate.table(probes, calibrate.responses(probes))
    head, tcp_hi, tcp_lo, udp = text.splitlines()
    assert head.split()[:5] == ["transport", "rate", "iters", "JCT", "s"]
    assert tcp_hi.split() == ["tcp", "200Mbit", "100", "5.0", "50.0", "-", "host-bound"]
    assert "x1.90 of x2.00 proportional" in tcp_lo and tcp_lo.endswith("network-bound")
    assert "failed: worker-0 exited with code 1" in udp and "more" not in udp


@dataclass
class _Result:
    jct_s: float
    iterations: int
    final_accuracy: float = 0.5
    converged: bool = False
    fidelity: Optional[dict[str, Any]] = None


def test_probes_fall_in_rate_transports_interleaved_and_later_ones_sized_by_earlier(tmp_path):
    job = _job()
    made: list[tuple[str, int, int, str]] = []

    def runner(j, out, progress):
        made.append((j.spec.transport.type, j.spec.network.uplink.bandwidth,
                     j.spec.training.iterations, out.name))
        if j.spec.transport.type == "udp" and j.spec.network.uplink.bandwidth == 200 * M:
            raise TailcutError("ps-0 exited with code 1")
        # 10 ms an iteration at 200 Mbit/s, in proportion below
        per = 0.01 * 200 * M / j.spec.network.uplink.bandwidth
        return _Result(jct_s=per * j.spec.training.iterations,
                       iterations=j.spec.training.iterations,
                       fidelity={"verdict": "network-bound", "reasons": []})
    said: list[str] = []
    probes = calibrate.execute(
        lambda t, r, n, i: calibrate.probe_job(job, t, r, n, i), ["tcp", "udp"],
        [200 * M, 100 * M], tmp_path, said.append, runner)
    first = calibrate.FIRST_ITERATIONS
    assert made == [("tcp", 200 * M, first, "200Mbit-tcp"), ("udp", 200 * M, first, "200Mbit-udp"),
                    ("tcp", 100 * M, 750, "100Mbit-tcp"),   # 15 s at 20 ms
                    ("udp", 100 * M, first, "100Mbit-udp")]   # as many as the failed one
    assert [p.state for p in probes] == ["finished", "failed", "finished", "finished"]
    assert probes[2].s_per_iteration == pytest.approx(0.02)
    assert any("udp at 200Mbit: FAILED: ps-0 exited with code 1" in s for s in said)
    assert calibrate.responses(probes)[0]["growth"] == pytest.approx(2.0)


def test_fixed_iterations_apply_to_every_probe(tmp_path):
    job = _job()
    asked: list[int] = []

    def runner(j, out, progress):
        asked.append(j.spec.training.iterations)
        return _Result(jct_s=1.0, iterations=j.spec.training.iterations)
    calibrate.execute(lambda t, r, n, i: calibrate.probe_job(job, t, r, n, i), ["tcp"],
                      [200 * M, 100 * M, 50 * M], tmp_path, lambda _: None, runner,
                      iterations=30)
    assert asked == [30, 30, 30]


@pytest.mark.netns
@pytest.mark.e2e
def test_a_small_calibration_probes_two_rates_and_changes_no_file(tmp_path):
    raw = yaml.safe_load(QUICKSTART.read_text())
    raw["metadata"]["name"] = "cale2e"
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(raw))
    before = job_file.read_bytes()
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "tailcut.cli", "calibrate", str(job_file),
                           "--rates", "200Mbit,100Mbit", "--iterations", "20",
                           "--results-dir", str(out), "--allow-busy"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr
    assert job_file.read_bytes() == before
    lines = done.stdout.splitlines()
    head = lines.index(next(line for line in lines if line.startswith("transport ")))
    assert lines[head + 1].split()[:3] == ["tcp", "200Mbit", "20"]
    assert lines[head + 2].split()[:3] == ["tcp", "100Mbit", "20"]
    assert " of x2.00 " in lines[head + 2]
    assert any(line.startswith("highest network-bound rate, tcp: ") for line in lines)
    document = json.loads((out / "calibrate.json").read_text())
    assert [p["rate"] for p in document["probes"]] == ["200Mbit", "100Mbit"]
    assert all(p["state"] == "finished" and p["iterations_run"] == 20
               and p["verdict"] in calibrate.verdict.VERDICTS for p in document["probes"])
    (check,) = document["rate_response"]
    assert check["expected"] == 2.0 and check["growth"] > 0
    assert document["host_before"]["allowed_busy"] is True
    for p in document["probes"]:
        assert json.loads((Path(p["results_dir"]) / "metrics.json").read_text())[
            "fidelity"]["verdict"] == p["verdict"]
    nothing_of("cale2e-caltcp1")
    nothing_of("cale2e-caltcp2")
