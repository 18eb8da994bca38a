"""tailcut.net.rtt: what a job's links add up to, and reading what TCP measured."""

import socket

import pytest

from tailcut import spec
from tailcut.net import netns, rtt, topology

# `ss -tinH state established` as iproute2 6.1 prints it (no state column), from a
# worker of a job with delayMs: 5 on its access links, in user-mode Linux.
SS_FILTERED = """\
0      0      10.1.0.3:40322 10.1.0.2:7000 
\t cubic wscale:7,7 rto:224 rtt:20.713/0.388 ato:40 mss:1448 pmtu:1500 rcvmss:1448 advmss:1448 cwnd:10 bytes_sent:2094713 minrtt:20.204 snd_wnd:1048576
"""
# `ss -tinH` without a state filter: a state column first, and a bbr line with mrtt.
SS_PLAIN = """\
ESTAB 0      0          127.0.0.1:46712    127.0.0.1:7000
\t bbr wscale:10,10 rto:204 rtt:0.033/0.018 mss:55808 bbr:(bw:49607108152bps,mrtt:0.009,pacing_gain:2.88672) minrtt:0.009 snd_wnd:111616
SYN-SENT 0 1 127.0.0.1:5000 127.0.0.1:5001
\t cubic rto:1000 backoff:1
"""


def job(network):
    return spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                           "metadata": {"name": "rtt"},
                           "spec": {"replicas": {"workers": 3}, "network": network}})


TWO_RACKS = {"racks": [{"name": "r0"}, {"name": "r1"}],
             "placement": {"ps-0": "r0", "worker-0": "r0", "worker-1": "r1",
                           "worker-2": "r1"}}


def test_ss_output_parses_with_and_without_a_state_column():
    assert rtt.parse_ss(SS_FILTERED) == [
        rtt.Sample("10.1.0.3:40322", "10.1.0.2:7000", 20.713, 0.388, 20.204)]
    assert rtt.parse_ss(SS_PLAIN) == [
        rtt.Sample("127.0.0.1:46712", "127.0.0.1:7000", 0.033, 0.018, 0.009)]
    assert rtt.parse_ss("") == []


def test_the_configured_rtt_counts_every_delayed_hop_both_ways():
    topo = topology.plan(job({**TWO_RACKS, "accessLink": {"delayMs": 5},
                              "uplink": {"delayMs": 0.5}}))
    assert rtt.configured_ms(topo, "worker-0", "ps-0") == 20    # one rack: 4 access ends
    assert rtt.configured_ms(topo, "worker-1", "ps-0") == 22    # and 4 uplink ends
    assert rtt.configured_ms(topo, "ps-0", "worker-2") == 22
    assert rtt.configured_ms(topology.plan(job(TWO_RACKS)), "worker-1", "ps-0") == 0


def test_a_pods_connections_are_set_beside_their_configured_rtt():
    topo = topology.plan(job({**TWO_RACKS, "accessLink": {"delayMs": 5}}))
    worker = topo.pod("worker-0").ip
    ps = topo.pod("ps-0").ip
    samples = [rtt.Sample(f"{worker}:40000", f"{ps}:7000", 21.0, 0.3, 20.5),
               rtt.Sample(f"{worker}:40001", "10.96.0.1:443", 1.0, 0.1, 0.9)]
    (row,) = rtt.compare(topo, "worker-0", samples)
    assert (row.pod, row.peer, row.configured_ms, row.rtt_ms) == ("worker-0", "ps-0", 20, 21)
    assert row.off_by() == pytest.approx(0.025)
    assert rtt.Comparison("a", "b", 0.0, 0.1, 0.05).off_by() is None


@pytest.mark.netns
def test_measure_reads_the_rtt_of_a_real_connection_in_a_namespace():
    name = "tailcut-rtt-test"   # tailcut's prefix: the session fails if it is left
    netns.create(name)
    try:
        with netns.entered(name):
            server = socket.create_server(("127.0.0.1", 0))
            client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        port = server.getsockname()[1]
        try:
            client.sendall(b"x" * 100_000)
            assert len(peer.recv(1 << 20)) > 0
            found = rtt.measure(name, port)
            assert {s.peer for s in found} >= {f"127.0.0.1:{port}"}
            assert all(0 < s.rtt_ms < 50 for s in found)
            assert rtt.measure(name, port + 1 if port < 65535 else 1) == []
        finally:
            for s in (client, peer, server):
                s.close()
    finally:
        netns.remove(name)


def test_the_report_gives_each_pair_of_pods_its_least_rtt_and_the_largest_gap():
    rows = [rtt.Comparison("worker-0", "ps-0", 20.0, 70.0, 69.0),   # read early, queued
            rtt.Comparison("worker-0", "ps-0", 20.0, 25.0, 20.4),
            rtt.Comparison("worker-0", "ps-0", 20.0, 31.0, 20.4),
            rtt.Comparison("worker-1", "ps-0", 20.0, 21.0, 19.0),
            rtt.Comparison("ps-0", "worker-0", 0.0, 0.1, 0.05)]
    got = rtt.report(rows)
    assert got["pairs"] == [
        {"pod": "ps-0", "peer": "worker-0", "configured_ms": 0.0, "rtt_ms": 0.1,
         "min_rtt_ms": 0.05, "samples": 1},
        {"pod": "worker-0", "peer": "ps-0", "configured_ms": 20.0, "rtt_ms": 31.0,
         "min_rtt_ms": 20.4, "samples": 3},
        {"pod": "worker-1", "peer": "ps-0", "configured_ms": 20.0, "rtt_ms": 21.0,
         "min_rtt_ms": 19.0, "samples": 1}]
    assert got["max_off_by"] == pytest.approx(-0.05)
    assert rtt.report([]) == {"pairs": [], "max_off_by": None}


def test_a_run_describes_its_rtts_by_configured_value():
    rows = [rtt.Comparison("worker-0", "ps-0", 20.0, 41.0, 20.2),
            rtt.Comparison("ps-0", "worker-0", 20.0, 30.0, 20.4),
            rtt.Comparison("worker-1", "ps-0", 22.0, 23.0, None)]
    assert rtt.describe(rows) == ("rtt: configured 20 ms: least 20.2 ms, smoothed median "
                                  "35.5 ms (2 connections); configured 22 ms: smoothed "
                                  "median 23.0 ms (1 connection)")
    assert rtt.describe([]) == "rtt: no connection between the job's pods was seen"
