"""The background plan: pods, measured interface, request rate and Locust commands."""

import pytest

from tailcut import spec
from tailcut.errors import SpecError
from tailcut.background import plan as bgplan
from tailcut.net import topology
from tailcut.runtime import background

JOB = """\
apiVersion: tailcut.dev/v1alpha1
kind: TrainingJob
metadata: {{name: bg-plan}}
spec:
  replicas: {{workers: 2}}
  network:
    racks: [{{name: rack-0}}, {{name: rack-1}}, {{name: rack-2}}]
    placement: {{ps-0: rack-0, worker-0: rack-1, worker-1: rack-2}}
    accessLink: {{bandwidth: 100Mbit}}
    uplink: {{bandwidth: 1Gbit}}
  backgroundLoad:
{background}
"""


def plan_of(background_yaml: str) -> bgplan.Plan:
    job = spec.load_text(JOB.format(background=background_yaml))
    p = bgplan.plan(job, topology.plan(job))
    assert p is not None
    return p


def test_background_pods_follow_the_training_pods_of_their_rack():
    job = spec.load_text(JOB.format(background="""\
    senders: [rack-1]
    receivers: [rack-0, rack-2]
    target: {requestsPerS: 10}"""))
    topo = topology.plan(job)
    names = [[p.name for p in r.pods] for r in topo.racks]
    assert names == [["ps-0", "bg-client-0"], ["worker-0", "bg-server-0"],
                     ["worker-1", "bg-client-1"]]
    server = topo.pod("bg-server-0")
    assert (server.role, server.slot, server.ip) == ("bg-server", 1, "10.2.0.3")
    assert server.netns == "tailcut-bg-plan.bg-server-0"


def test_the_rate_is_load_factor_times_bandwidth_over_mean_flow_bytes():
    p = plan_of("""\
    senders: [rack-0]
    receivers: [rack-1]
    target: {link: uplink/rack-0, loadFactor: 0.5}
    flowSizes: {distribution: fixed, bytes: 1000000}""")
    assert p.requests_per_s == pytest.approx(0.5 * 1e9 / 8 / (1_000_000 + 120))
    assert p.users == 63  # one per request/s of peak rate
    assert p.link == bgplan.MeasuredLink("uplink/rack-0", "up", "tailcut-bg-plan.rack-0",
                                         "up", 10**9)


def test_flows_into_a_rack_are_measured_where_the_spine_sends_them():
    p = plan_of("""\
    senders: [rack-0]
    receivers: [rack-1]
    target: {link: uplink/rack-1, loadFactor: 0.2}""")
    assert p.link is not None and p.link.direction == "down"
    assert (p.link.netns, p.link.ifname) == ("tailcut-bg-plan.spine", "r1")


def test_flows_into_the_ps_load_its_access_link_at_the_rack_port():
    p = plan_of("""\
    senders: [rack-1]
    receivers: [ps-0]
    target: {link: access/ps-0, loadFactor: 0.5}
    flowSizes: {distribution: web-search}""")
    assert p.clients == (bgplan.Endpoint("ps-0", "tailcut-bg-plan.ps-0", "10.1.0.2"),)
    assert p.link is not None
    assert (p.link.netns, p.link.ifname, p.link.bandwidth_bit) == (
        "tailcut-bg-plan.rack-0", "p0", 10**8)


def test_a_rate_locust_cannot_drive_is_refused_naming_the_target():
    with pytest.raises(SpecError, match="spec.backgroundLoad.target: needs 31250 requests/s at peak"):
        plan_of("""\
    senders: [rack-0]
    receivers: [rack-1]
    target: {link: uplink/rack-0, loadFactor: 0.5}
    flowSizes: {distribution: fixed, bytes: 1880}""")


def test_runs_without_a_duration_are_bounded_by_the_training_timeout():
    p = plan_of("""\
    senders: [rack-0]
    receivers: [rack-1]
    target: {requestsPerS: 5}""")
    assert p.run_time_s == 600 + 2 + bgplan.RUN_GRACE_S


def test_one_client_pod_runs_locust_alone_and_several_get_a_master_and_workers(tmp_path):
    one = plan_of("""\
    senders: [rack-0]
    receivers: [rack-1]
    target: {requestsPerS: 5}
    durationS: 10""")
    [(ns, argv, _)] = background.locust_commands(one, tmp_path / "locust")
    assert ns == "tailcut-bg-plan.bg-client-0"
    assert "--headless" in argv and "--master" not in argv and "11s" in argv
    two = plan_of("""\
    senders: [rack-0]
    receivers: [rack-1, rack-2]
    target: {requestsPerS: 5}
    durationS: 10""")
    cmds = background.locust_commands(two, tmp_path / "locust")
    assert [c[0] for c in cmds] == ["tailcut-bg-plan.bg-client-0",
                                    "tailcut-bg-plan.bg-client-0",
                                    "tailcut-bg-plan.bg-client-1"]
    master, worker = cmds[0][1], cmds[2][1]
    assert master[master.index("--expect-workers") + 1] == "2"
    assert worker[worker.index("--master-host") + 1] == two.clients[0].ip


def test_the_locust_config_carries_servers_rate_shape_and_sizes():
    p = plan_of("""\
    senders: [rack-0]
    receivers: [rack-1]
    target: {requestsPerS: 5}
    flowSizes: {distribution: fixed, bytes: 10}
    shape: {type: onOff, onS: 1, offS: 2}""")
    cfg = p.locust_config()
    assert cfg["servers"] == ["http://10.1.0.3:8080"]
    assert cfg["requests_per_s"] == 5
    assert cfg["shape"] == {"type": "onOff", "steps": None, "onS": 1.0, "offS": 2.0}
    assert cfg["cdf"] == [[10, 0.0], [10, 1.0]]
