"""spec.network.inNetwork: what it takes, what it refuses (naming the field), and the
plan's model-dependent checks."""

import base64

import numpy as np
import pytest

from tailcut import plan, spec
from tailcut.errors import SpecError
from tailcut.net import topology
from tailcut.ml import models


def job(in_network, **spec_overrides):
    s = {"replicas": {"workers": 8},
         "training": {"model": "sparse"},
         "network": {"racks": [{"name": "rack-0"}, {"name": "rack-1"}],
                     "inNetwork": in_network}}
    for key, value in spec_overrides.items():
        s[key] = {**s.get(key, {}), **value}
    return spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                           "metadata": {"name": "hot"}, "spec": s})


def test_top_k_or_a_list_is_resolved_once_and_reaches_every_role_with_the_stores_address():
    j = job({"hotParameters": {"topK": 900}})
    assert j.spec.network.in_network.hot_parameters.top_k == 900
    section = plan.in_network(j)["hot_store"]
    assert (section["address"], section["rack"], section["top_k"]) == ("10.1.0.254", 0, None)
    assert len(section["indices"]) == 900 and section["indices"] == sorted(section["indices"])
    model = models.create("sparse", models.dataset("sparse", 0))
    initial = np.frombuffer(base64.b64decode(section["initial"]), dtype="<f4")
    assert np.array_equal(initial, model.init_params(np.random.default_rng(0))[
        section["indices"]])   # the store's starting values, as data
    for pod in ("ps-0", "worker-7"):
        assert plan.role_config(j, pod, "/r", plan.hosts(topology.plan(j))).hot == section
    listed = job({"hotParameters": {"indices": [3, 1, 2]}})
    assert plan.in_network(listed)["hot_store"]["indices"] == [1, 2, 3]
    assert plan.in_network(job(None)) == {}


@pytest.mark.parametrize("hot, says", [
    ({"topK": 5, "indices": [1]}, "exactly one of topK"),
    ({}, "exactly one of topK"),
    ({"indices": [4, 2, 4]}, "4 appears twice"),
    ({"indices": [-1]}, "-1 is negative"),
    ({"topK": 70000}, "less than or equal to 65520"),
])
def test_a_malformed_hot_set_is_refused_naming_the_field(hot, says):
    with pytest.raises(SpecError, match="spec.network.inNetwork.hotParameters") as err:
        job({"hotParameters": hot})
    assert says in str(err.value)


@pytest.mark.parametrize("overrides, says", [
    ({"training": {"syncMode": "async"}}, "needs bsp"),
    ({"replicas": {"parameterServers": 2}}, "parameterServers is 2"),
    ({"replicas": {"psReplica": True}}, "psReplica"),
    ({"replicas": {"workers": 33}}, "at most 32"),
    ({"transport": {"type": "bounded-loss", "p": 0.9}}, "transport.type is bounded-loss"),
    ({"scheduling": {"policy": "cadentflow"}}, "scheduling.policy is cadentflow"),
])
def test_what_the_store_cannot_serve_is_refused_before_anything_runs(overrides, says):
    with pytest.raises(SpecError, match="network.inNetwork: not with") as err:
        job({"hotParameters": {"topK": 10}}, **overrides)
    assert says in str(err.value)


def test_hot_parameters_past_the_model_are_refused_by_the_plan_on_both_executors():
    for hot, model, says in (
            ({"indices": [0, 92113]}, "sparse", "indices: 92113 is past model sparse's "
                                                "92113 parameters"),
            ({"topK": 65000}, "mlp", "topK: 65000 is past model mlp's 64714 parameters")):
        j = job({"hotParameters": hot}, training={"model": model})
        for executor in plan.EXECUTORS:
            assert says in plan.refusals(j, executor)[0].message
    ok = job({"hotParameters": {"topK": 65520}})
    assert plan.refusals(ok, "local") == plan.refusals(ok, "kubernetes") == []


def test_aggregate_reaches_every_role_with_each_racks_address_and_workers():
    j = job({"aggregate": True}, network={"placement": {"ps-0": "rack-0", "worker-0": "rack-1"}})
    config = plan.role_config(j, "worker-3", "/r", plan.hosts(topology.plan(j))).aggregate
    topo = topology.plan(j)
    by_rack = {r.index: sorted(p.index for p in r.pods if p.role == "worker")
               for r in topo.racks}
    assert config == {"racks": [{"index": r, "address": f"10.{r + 1}.0.253", "workers": w}
                                for r, w in sorted(by_rack.items()) if w],
                      "elements": 92113}
    assert plan.role_config(j, "ps-0", "/r", plan.hosts(topo)).hot is None


@pytest.mark.parametrize("in_network", [{"aggregate": False}, {}])
def test_in_network_asking_for_nothing_is_refused_naming_the_field(in_network):
    with pytest.raises(SpecError, match="spec.network.inNetwork") as err:
        job(in_network)
    assert "give hotParameters, aggregate: true or multicast: true" in str(err.value)


def test_every_kind_of_in_network_work_together_reaches_the_roles():
    j = job({"hotParameters": {"topK": 5}, "aggregate": True, "multicast": True})
    config = plan.role_config(j, "worker-0", "/r", plan.hosts(topology.plan(j)))
    assert config.hot is not None and config.aggregate is not None
    assert config.multicast is not None
    assert sorted(plan.in_network(j)) == ["aggregation", "hot_store", "multicast"]


def test_multicast_reaches_every_role_alone_and_with_aggregation():
    for in_network in ({"multicast": True}, {"multicast": True, "aggregate": True}):
        j = job(in_network, network={"placement": {"ps-0": "rack-0", "worker-0": "rack-1"}})
        topo = topology.plan(j)
        config = plan.role_config(j, "worker-3", "/r", plan.hosts(topo)).multicast
        by_rack = {r.index: sorted(p.index for p in r.pods if p.role == "worker")
                   for r in topo.racks}
        assert config == {"racks": [{"index": r, "address": f"10.{r + 1}.0.252",
                                     "workers": w} for r, w in sorted(by_rack.items()) if w],
                          "elements": 92113}
        assert (plan.role_config(j, "ps-0", "/r", plan.hosts(topo)).aggregate is not None) \
            == in_network.get("aggregate", False)


def test_what_aggregation_cannot_serve_is_refused_naming_the_field():
    with pytest.raises(SpecError, match="network.inNetwork: not with") as err:
        job({"aggregate": True}, training={"syncMode": "ssp", "staleness": 1})
    assert "needs bsp" in str(err.value)
    with pytest.raises(SpecError, match="inNetwork.aggregate: model even-mlp has 784394"):
        plan.check(job({"aggregate": True}, training={"model": "even-mlp"}), "local")


def test_the_plan_asks_each_kind_to_check_the_job_with_the_models_parameter_count(
        monkeypatch):
    """plan.check names no kind: it builds the model once and asks every registered
    kind (a kind of one's own too) whether its programs hold what the job asks."""
    from tailcut import innetplan
    asked = []

    def refuse(j, parameters):
        asked.append(parameters)
        raise SpecError("spec.network.inNetwork.kinds.toy: too many for the toy")
    toy = innetplan.KindPlan("toy", lambda j, topo: None, check=refuse)
    monkeypatch.setattr(innetplan, "kinds", lambda: (*innetplan.KINDS, toy))
    j = job({"hotParameters": {"topK": 10}})
    refusals = plan.refusals(j, "local")
    assert [r.message for r in refusals] == [
        "spec.network.inNetwork.kinds.toy: too many for the toy"]
    assert asked == [models.create("sparse", models.dataset("sparse", 0)).num_params]
