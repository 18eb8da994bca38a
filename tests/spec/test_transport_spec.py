"""The spec's transport field: one line switches transport; p is checked where it applies."""

import pytest

from tailcut import spec
from tailcut import plan
from tailcut.net import topology
from tests.spec.test_spec import error_of, load


@pytest.mark.parametrize("line,kind,p", [
    ("{type: tcp}", "tcp", None),
    ("{type: udp}", "udp", None),
    ("{type: bounded-loss, p: 0.9}", "bounded-loss", 0.9),
    ("{type: app-drop, p: 1}", "app-drop", 1.0),
])
def test_one_line_switches_the_transport(line: str, kind: str, p: object) -> None:
    job = load(f"spec: {{transport: {line}}}")
    assert (job.spec.transport.type, job.spec.transport.p) == (kind, p)


@pytest.mark.parametrize("line,words", [
    ("{type: bounded-loss}", "spec.transport.p: bounded-loss needs p"),
    ("{type: app-drop}", "spec.transport.p: app-drop needs p"),
    ("{type: bounded-loss, p: 0}", "spec.transport.p=0: must be greater than 0"),
    ("{type: bounded-loss, p: 1.5}", "spec.transport.p=1.5: must be less than or equal to 1"),
    ("{type: tcp, p: 0.9}", "spec.transport.p: only bounded-loss and app-drop take p"),
    ("{type: tcp, rateMbit: 100}", "spec.transport.rateMbit: tcp is paced by TCP"),
    ("{type: bounded-loss, p: 0.9, xdpMode: offload}", "spec.transport.xdpMode='offload'"),
    ("{type: udp, minP: 0.5}", "spec.transport.minP: only bounded-loss closes a message early"),
    ("{type: bounded-loss, p: 0.8, minP: 0.9}", "spec.transport.minP: 0.9 is above p = 0.8"),
    ("{type: bounded-loss, p: 0.8, minP: 0}", "spec.transport.minP=0: must be greater than 0"),
    ("{type: udp, tcpCongestionControl: cubic}",
     "spec.transport.tcpCongestionControl: only tcp and app-drop"),
    ("{type: tcp, tcpCongestionControl: 'Cubic;rm'}", "spec.transport.tcpCongestionControl="),
])
def test_bad_transport_settings_name_the_field(line: str, words: str) -> None:
    assert words in error_of(f"spec: {{transport: {line}}}")


def test_no_sender_gets_a_static_share_unless_the_spec_sets_a_rate() -> None:
    job = spec.load_file("examples/bounded-loss.yaml")
    topo = topology.plan(job)
    ps = plan.transport_options(job, topo.pod("ps-0"))
    w = plan.transport_options(job, topo.pod("worker-2"))
    assert ps == {"type": "bounded-loss", "job": "bl-quickstart", "mtu": 1500,
                  "rate_bit": None, "seed": 0, "p": 0.9, "xdp_mode": "generic",
                  "gso": True,    # lossy: the pods' interfaces cut it (net/build.py)
                  "switch_buffer_bytes": None,   # the kernel's deep queues
                  "link_bit": 1_000_000_000}   # the link's rate, which grants share: no cap
    assert w["rate_bit"] is None and w["seed"] == 3
    capped = load("spec: {transport: {type: udp, rateMbit: 300}}")
    assert plan.transport_options(capped, topology.plan(capped).pod("worker-0"))[
        "rate_bit"] == 300e6
    tcp = load("spec: {transport: {type: tcp}}")
    assert plan.transport_options(tcp, topology.plan(tcp).pod("ps-0")) == {"type": "tcp"}
    cubic = load("spec: {transport: {type: tcp, tcpCongestionControl: cubic}}")
    assert plan.transport_options(cubic, topology.plan(cubic).pod("ps-0")) == {
        "type": "tcp", "congestion_control": "cubic"}


def test_min_p_reaches_the_bounded_loss_transport_only_when_the_spec_sets_it() -> None:
    job = load("spec: {transport: {type: bounded-loss, p: 0.9, minP: 0.8}}")
    options = plan.transport_options(job, topology.plan(job).pod("worker-0"))
    assert options["min_p"] == 0.8 and options["p"] == 0.9
    from tailcut import transports
    t = transports.get(options.pop("type"), **{**options, "xdp": False})
    try:
        assert t._recv.early_close and t._recv.min_p == 0.8  # type: ignore[attr-defined]
    finally:
        t.close()
    plain = load("spec: {transport: {type: bounded-loss, p: 0.9}}")
    assert "min_p" not in plan.transport_options(plain, topology.plan(plain).pod("ps-0"))
