"""The verdict from its evidence (pure): each measure moves it, and says why."""

from tailcut.fidelity import verdict

QUIET_HOST = {"wall_s": 10.0, "cores": 2, "busy": 0.40, "softirq": 0.05, "steal": 0.0,
              "psi_some": 0.10, "load1": 0.8}
NO_OTHERS = {"cpu_s": {"job": 8.0, "kernel": 0.2, "others": 0.1},
             "share": {"job": 0.4, "kernel": 0.01, "others": 0.005}, "busiest_others": {}}


def links(drain=1.0, busy_rate=1.0, backlogged_share=0.5, samples=200):
    backlogged = int(backlogged_share * samples)
    return {"ends": {"rack-1/up": {"rate_bit": 10**8, "backlogged": backlogged,
                                   "backlogged_share": backlogged_share, "drain": drain,
                                   "busy_intervals": backlogged, "busy_rate": busy_rate,
                                   "sent_bytes": 1},
                     "pod/eth0": {"rate_bit": 10**8, "backlogged": 2,
                                  "backlogged_share": 0.01, "drain": 1.0,
                                  "busy_intervals": 0, "busy_rate": None, "sent_bytes": 1}},
            "samples": samples, "interval_s": 0.05, "errors": []}


def test_a_quiet_host_whose_links_kept_their_rate_is_network_bound():
    got = verdict.judge(QUIET_HOST, NO_OTHERS, links())
    assert got["verdict"] == "network-bound" and got["reasons"] == []
    assert verdict.describe(got)[0].startswith("fidelity: network-bound")


def test_full_cores_make_a_run_host_bound_naming_the_share():
    got = verdict.judge({**QUIET_HOST, "busy": 0.95}, NO_OTHERS, links())
    assert got["verdict"] == "host-bound"
    assert "95% busy" in got["reasons"][0]


def test_cpu_pressure_alone_can_make_it_marginal_or_host_bound():
    assert verdict.judge({**QUIET_HOST, "psi_some": 0.5}, NO_OTHERS, links())["verdict"] \
        == "marginal"
    assert verdict.judge({**QUIET_HOST, "psi_some": 0.8}, NO_OTHERS, links())["verdict"] \
        == "host-bound"


def test_other_processes_taking_the_cores_are_named():
    others = {**NO_OTHERS, "share": {**NO_OTHERS["share"], "others": 0.3},
              "busiest_others": {"go": 5.0, "cc1": 1.0}}
    got = verdict.judge(QUIET_HOST, others, links())
    assert got["verdict"] == "host-bound"
    assert "other processes took 30% of the cores (go, cc1)" in got["reasons"][0]


def test_a_links_busy_rate_is_evidence_not_judged():
    # a bursty queue that empties between samples reads low without any stall
    got = verdict.judge(QUIET_HOST, NO_OTHERS, links(busy_rate=0.6))
    assert got["verdict"] == "network-bound"
    assert got["evidence"]["links"]["ends"]["rack-1/up"]["busy_rate"] == 0.6


def test_a_link_that_did_not_drain_what_it_held_is_named():
    got = verdict.judge(QUIET_HOST, NO_OTHERS, links(drain=0.8))
    assert got["verdict"] == "host-bound"
    assert "link end rack-1/up drained 80% of what it held" in got["reasons"][0]
    assert verdict.judge(QUIET_HOST, NO_OTHERS, links(drain=0.9))["verdict"] == "marginal"


def test_a_link_backlogged_too_briefly_says_nothing_of_its_rate():
    # 5 backlogged intervals of 200: below MIN_BACKLOGGED_INTERVALS
    got = verdict.judge(QUIET_HOST, NO_OTHERS, links(drain=0.2, busy_rate=0.2,
                                                       backlogged_share=0.025))
    assert not any("20%" in r for r in got["reasons"])


def test_links_that_were_hardly_busy_make_it_marginal():
    got = verdict.judge(QUIET_HOST, NO_OTHERS, links(backlogged_share=0.05))
    assert got["verdict"] == "marginal"
    assert "no link was busy for long (at most 5% of the window, at rack-1/up)" \
        in got["reasons"][0]


def test_a_link_kept_busy_by_a_paced_sender_without_a_queue_bounds_the_run():
    paced = links(backlogged_share=0.02)
    paced["ends"]["rack-1/up"]["utilization"] = 0.8
    assert verdict.judge(QUIET_HOST, NO_OTHERS, paced)["verdict"] == "network-bound"


def test_missing_evidence_is_said_not_guessed():
    got = verdict.judge(QUIET_HOST, None, None, {"netem": False, "round_trip_ms": 0})
    assert got["verdict"] == "network-bound"
    assert any("not sampled" in n for n in got["notes"])
    assert any("no netem" in n for n in got["notes"])
    assert "links not sampled" in verdict.describe(got)[0]


def test_delay_notes_say_what_was_emulated():
    assert "adds" not in " ".join(verdict.delay_notes({"netem": True, "round_trip_ms": 0}))
    assert verdict.delay_notes({"netem": True, "round_trip_ms": 8})[0].startswith(
        "links add 8 ms")
