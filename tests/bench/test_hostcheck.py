"""bench/hostcheck.py: a ratio is "met" only when both sides were network-bound, a
busy host is refused unless --allow-busy, and a run's verdict travels with its figures."""

import argparse
import subprocess
import sys

import pytest

from bench import hostcheck
from tailcut.fidelity import verdict

QUIET = {"host": {"wall_s": 2.0, "cores": 2, "busy": 0.2, "load1": 0.3},
         "processes": {"cpu_s": {"job": 0.0, "kernel": 0.0, "others": 0.08},
                       "share": {"job": 0.0, "kernel": 0.0, "others": 0.02},
                       "busiest_others": {}}}
BUSY = {"host": {"wall_s": 2.0, "cores": 2, "busy": 0.97, "load1": 6.5},
        "processes": {"cpu_s": {"job": 0.0, "kernel": 0.0, "others": 3.2},
                      "share": {"job": 0.0, "kernel": 0.0, "others": 0.8},
                      "busiest_others": {"cc1plus": 2.9, "firefox": 0.3}}}


def args(*argv):
    parser = argparse.ArgumentParser()
    hostcheck.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_allow_busy_is_an_option_with_help():
    parser = argparse.ArgumentParser()
    hostcheck.add_arguments(parser)
    assert "--allow-busy" in parser.format_help()
    assert args().allow_busy is False and args("--allow-busy").allow_busy is True


def test_a_ratio_is_met_only_when_every_run_of_both_sides_was_network_bound():
    nb = verdict.NETWORK_BOUND
    assert hostcheck.mark({"tcp": [nb, nb], "bounded-loss": [nb]}) == "met"
    assert hostcheck.mark({"tcp": [nb], "bounded-loss": [verdict.MARGINAL]}) \
        == "(tcp network-bound, bounded-loss marginal)"
    assert hostcheck.mark({"tcp": [verdict.HOST_BOUND, nb, nb], "bl": [nb]}) \
        == "(tcp 2 network-bound + 1 host-bound, bl network-bound)"


def test_a_run_without_a_verdict_or_a_side_without_runs_is_not_met():
    nb = verdict.NETWORK_BOUND
    assert hostcheck.mark({"kubernetes": [None], "tailcut run": [nb]}) \
        == "(kubernetes unmeasured, tailcut run network-bound)"
    assert hostcheck.mark({"tcp": [], "bl": [nb]}) == "(tcp no runs, bl network-bound)"


def test_a_quiet_host_is_not_refused():
    assert hostcheck.refusal(QUIET) is None
    at_margin = {**QUIET, "processes": {**QUIET["processes"],
                                        "share": {"others": hostcheck.BUSY_SHARE}}}
    assert hostcheck.refusal(at_margin) is None


def test_a_busy_host_is_refused_naming_the_share_the_load_and_the_busiest():
    why = hostcheck.refusal(BUSY)
    assert why is not None
    assert "80% of the cores" in why and "load 6.5" in why and "cc1plus 2.9 s" in why
    assert "--allow-busy" in why


def test_before_exits_2_on_a_busy_host_unless_allowed(monkeypatch, capsys):
    monkeypatch.setattr(hostcheck, "measure", lambda seconds=2.0: BUSY)
    with pytest.raises(SystemExit) as ended:
        hostcheck.before(args())
    assert ended.value.code == 2
    assert "refused to start" in capsys.readouterr().err
    watch = hostcheck.before(args("--allow-busy"))
    assert watch.before is BUSY
    assert "going on (--allow-busy)" in capsys.readouterr().out


def test_before_goes_on_quietly_on_a_quiet_host(monkeypatch, capsys):
    monkeypatch.setattr(hostcheck, "measure", lambda seconds=2.0: QUIET)
    assert hostcheck.before(args()).before is QUIET
    out = capsys.readouterr()
    assert "before the runs: host 20% busy" in out.out and out.err == ""


def test_a_runs_verdict_and_host_figures_come_from_its_fidelity():
    fidelity = verdict.judge(host=BUSY["host"], processes=BUSY["processes"])
    assert hostcheck.columns(fidelity) == {"verdict": "host-bound", "host_busy": 0.97,
                                           "load1": 6.5, "others_cpu": 0.8}
    assert hostcheck.during(fidelity).startswith("host-bound (host 97% busy of 2 cores, "
                                                 "load 6.50, other processes 80% (cc1plus")
    assert hostcheck.columns(None)["verdict"] == hostcheck.during(None) == "unmeasured"
    assert hostcheck.verdict_of("marginal") == "marginal"   # a status with the word only


def test_a_run_outside_the_runtime_is_judged_from_the_host_alone():
    assert hostcheck.verdict_of(hostcheck.judged(QUIET)) == "network-bound"
    busy = hostcheck.judged(BUSY)
    assert busy["verdict"] == "host-bound" and "the links' rates were not sampled" in \
        busy["notes"]


def test_the_benchs_own_children_are_not_other_processes():
    spin = ("import time\n"
            "open('/proc/self/comm', 'w').write('hostcheck-spin')\n"
            "while time.process_time() < 0.5: pass\n"
            "print('spun', flush=True); time.sleep(30)")
    watch = hostcheck.Watch()
    child = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "spun"
        reading = watch.stop()
    finally:
        child.kill()
        child.wait()
    assert reading["processes"]["cpu_s"]["job"] >= 0.4
    assert "hostcheck-spin" not in reading["processes"]["busiest_others"]
