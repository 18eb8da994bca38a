"""Varys' MADD rates: every flow of a coflow ends at the coflow's bottleneck time."""

import pytest

from tailcut import spec
from tailcut.net import topology
from tailcut.scheduling import madd


def _job(name: str, replicas: dict, placement: dict | None = None) -> spec.TrainingJob:
    network = {"accessLink": {"bandwidth": "100Mbit"}, "uplink": {"bandwidth": "50Mbit"}}
    if placement is not None:
        network["racks"] = [{"name": "r1"}, {"name": "r2"}]
        network["placement"] = placement
    return spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                           "metadata": {"name": name},
                           "spec": {"replicas": replicas, "network": network}})


def test_every_flow_gets_its_bytes_over_the_bottleneck_time():
    caps = {"a": 10.0, "b": 10.0, "c": 5.0}
    flows = [madd.Flow("x", ("a", "b"), 20.0), madd.Flow("y", ("a", "c"), 30.0)]
    # link a carries 50 bytes at 10/s: 5 s; c carries 30 at 5/s: 6 s -> Gamma = 6 s.
    assert madd.gamma_s(flows, caps) == pytest.approx(6.0)
    rates = madd.rates(flows, caps)
    assert rates == {"x": pytest.approx(20 / 6), "y": pytest.approx(5.0)}
    # All finish at Gamma, and no link is over its capacity.
    assert {k: f.bytes / rates[k] for k, f in zip("xy", flows)} == {
        "x": pytest.approx(6.0), "y": pytest.approx(6.0)}
    assert rates["x"] + rates["y"] <= caps["a"]


def test_a_flow_of_zero_bytes_gets_no_rate_and_an_empty_coflow_takes_no_time():
    assert madd.rates([madd.Flow("x", ("a",), 0.0)], {"a": 1.0}) == {"x": 0.0}
    assert madd.gamma_s([], {"a": 1.0}) == 0.0


def test_a_link_without_a_capacity_is_named_in_the_error():
    with pytest.raises(ValueError, match="flow 'x' crosses link 'nope'"):
        madd.rates([madd.Flow("x", ("nope",), 1.0)], {"a": 1.0})


def test_repeated_flow_keys_are_refused():
    with pytest.raises(ValueError, match="unique"):
        madd.rates([madd.Flow("x", ("a",), 1.0), madd.Flow("x", ("a",), 2.0)], {"a": 1.0})


def test_the_smaller_coflow_goes_first_and_the_other_gets_what_is_left():
    caps = {"a": 10.0, "b": 10.0}
    coflows = {"big": [madd.Flow("big", ("a",), 100.0)],
               "small": [madd.Flow("s1", ("a",), 5.0), madd.Flow("s2", ("b",), 50.0)]}
    # small: Gamma = max(5/10, 50/10) = 5 s -> s1 0.5/s, s2 10/s; big takes the 9.5 left.
    rates = madd.allocate(coflows, caps, floor=0.01)
    assert rates == {"s1": pytest.approx(1.0), "s2": pytest.approx(10.0),
                     "big": pytest.approx(9.0)}


def test_a_coflow_whose_link_is_full_waits_at_the_floor_rate():
    caps = {"a": 10.0}
    coflows = {"first": [madd.Flow("f", ("a",), 10.0)],
               "second": [madd.Flow("g", ("a",), 1000.0)]}
    assert madd.allocate(coflows, caps, floor=0.5) == {"f": pytest.approx(10.0), "g": 0.5}


def test_paths_cross_the_uplinks_only_between_racks():
    job = _job("cof-madd-path", {"workers": 2},
               placement={"ps-0": "r1", "worker-0": "r1", "worker-1": "r2"})
    topo = topology.plan(job)
    assert madd.path(topo, "ps-0", "worker-0") == ("ps-0/up", "worker-0/down")
    assert madd.path(topo, "worker-1", "ps-0") == ("worker-1/up", "rack:r2/up",
                                                   "rack:r1/down", "ps-0/down")


def test_capacities_are_the_links_goodput_in_bytes_below_a_headroom():
    topo = topology.plan(_job("cof-madd-caps", {"workers": 1}))
    caps = madd.capacities(topo, headroom=1.0)
    assert caps["ps-0/up"] == pytest.approx(100e6 / 8 * 1448 / 1514)
    assert caps[f"rack:{topo.racks[0].name}/up"] == pytest.approx(50e6 / 8 * 1448 / 1514)
    assert madd.capacities(topo)["ps-0/up"] == pytest.approx(
        madd.HEADROOM * caps["ps-0/up"])
    with pytest.raises(ValueError, match="headroom=0"):
        madd.capacities(topo, headroom=0)


def test_a_ps_broadcast_is_bottlenecked_by_the_ps_link():
    topo = topology.plan(_job("cof-madd-ps", {"workers": 3}))
    caps = madd.capacities(topo)
    flows = [madd.Flow(w, madd.path(topo, "ps-0", w), size)
             for w, size in (("worker-0", 1e6), ("worker-1", 2e6), ("worker-2", 3e6))]
    rates = madd.rates(flows, caps)
    assert sum(rates.values()) == pytest.approx(caps["ps-0/up"])
    assert rates["worker-2"] == pytest.approx(3 * rates["worker-0"])
