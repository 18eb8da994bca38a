"""A run's overheads by phase: summed, the JCT set apart, shown in one line."""

import time

import pytest

from tailcut.runtime import overheads


def test_the_overhead_is_the_total_of_the_phases_minus_training():
    phases = overheads.Phases()
    for phase, s in (("startup", 0.4), ("network_build", 0.1), ("role_start", 0.7),
                     ("training", 6.0), ("teardown", 0.2), ("report", 0.5)):
        phases.add(phase, s)
    phases.add("report", 0.1)          # a phase may come in parts
    phases.add("bpf_compile", 0.05)    # shown apart: already inside other phases
    summary = phases.summary()
    assert summary["report"] == 0.6
    assert summary["total"] == pytest.approx(8.0)
    assert summary["overhead"] == pytest.approx(2.0)
    assert list(summary)[:6] == ["startup", "network_build", "role_start", "training",
                                 "teardown", "report"]
    line = overheads.describe(summary)
    assert line.startswith("overheads: startup 0.40 s, network build 0.10 s, role start")
    assert "2.00 s of tailcut around a JCT of 6.00 s" in line and "training" not in line


def test_a_phase_outside_the_list_is_refused_and_timed_adds_the_elapsed_time():
    phases = overheads.Phases()
    with pytest.raises(ValueError, match="phase 'plots'"):
        phases.add("plots", 1.0)
    with phases.timed("teardown"):
        time.sleep(0.05)
    assert 0.04 < phases.seconds["teardown"] < 1.0


def test_the_process_age_counts_from_this_processs_start():
    age = overheads.process_age_s()
    time.sleep(0.05)
    assert 0 < age < overheads.process_age_s() < 24 * 3600
