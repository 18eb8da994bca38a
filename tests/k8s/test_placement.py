"""Racks to nodes: which nodes count, the round robin, and the record in the job's status."""

from tailcut import spec
from tailcut.k8s.manifests import limits, placement, resources, status


def node(name, ready="True", ip="10.240.0.2", **spec_fields):
    return {"metadata": {"name": name, "labels": {placement.HOSTNAME_LABEL: name}},
            "spec": spec_fields,
            "status": {"conditions": [{"type": "Ready", "status": ready}],
                       "addresses": [{"type": "InternalIP", "address": ip}]}}


def job(racks):
    return spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                           "metadata": {"name": "pl-job"},
                           # two pods a rack: the PS and 2 * racks - 1 workers
                           "spec": {"replicas": {"workers": 2 * racks - 1},
                                    "network": {"racks": [{"name": f"r{i}"}
                                                          for i in range(racks)]}}})


def test_only_ready_untainted_uncordoned_nodes_with_an_address_count_sorted_by_name():
    nodes = [node("b", ip="10.0.0.2"), node("a", ip="10.0.0.1"), node("c", ready="False"),
             node("d", unschedulable=True),
             node("e", taints=[{"key": "x", "effect": "NoSchedule"}]),
             node("f", taints=[{"key": "x", "effect": "PreferNoSchedule"}], ip="10.0.0.6"),
             {**node("g"), "status": {"conditions": [{"type": "Ready", "status": "True"}]}}]
    assert [(n.name, n.ip) for n in placement.schedulable(nodes)] == [
        ("a", "10.0.0.1"), ("b", "10.0.0.2"), ("f", "10.0.0.6")]


def test_racks_go_round_robin_from_a_start_that_depends_on_the_job():
    nodes = placement.schedulable([node(n, ip=f"10.0.0.{i}") for i, n in enumerate("abc")])
    where = placement.place(job(4), "lab", nodes)
    names = [where[f"r{i}"].name for i in range(4)]
    start = "abc".index(names[0])
    assert names == [("abc" * 3)[start + i] for i in range(4)]
    starts = {placement.place(job(1), f"ns-{i}", nodes)["r0"].name for i in range(30)}
    assert starts == {"a", "b", "c"}, "jobs do not all start on one node"
    assert placement.place(job(2), "lab", []) == {}


def test_a_rack_with_no_pod_is_placed_nowhere_and_counts_for_no_queue_memory():
    nodes = placement.schedulable([node(n, ip=f"10.0.0.{i}") for i, n in enumerate("ab")])
    raw = {"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
           "metadata": {"name": "pl-empty"},
           "spec": {"replicas": {"workers": 2},
                    "network": {"racks": [{"name": f"r{i}"} for i in range(3)],
                                "placement": {"ps-0": "r0", "worker-0": "r0",
                                              "worker-1": "r2"}}}}
    sparse = spec.from_dict(raw)
    where = placement.place(sparse, "lab", nodes)
    assert sorted(where) == ["r0", "r2"] and where["r0"] != where["r2"], \
        "the occupied racks alone go round robin"
    raw["spec"]["network"]["racks"] = [{"name": "r0"}, {"name": "r2"}]
    assert limits.ask(sparse, 1) == limits.ask(spec.from_dict(raw), 1)


def test_the_placement_pins_pods_and_survives_the_jobs_status():
    nodes = placement.schedulable([node("a", ip="10.0.0.1"), node("b", ip="10.0.0.2")])
    j = job(2)
    where = placement.place(j, "lab", nodes)
    recorded = placement.to_status(where)
    assert status.Status.model_validate({"placement": recorded}).placement["r0"].ip in (
        "10.0.0.1", "10.0.0.2"), "status.placement fits the status schema"
    assert placement.from_status(recorded) == where
    pods = resources.pods(j, {"uid": "x"}, "img", where=where)
    for pod in pods:
        rack = pod["metadata"]["labels"][resources.LABEL_RACK]
        assert pod["spec"]["nodeSelector"] == {placement.HOSTNAME_LABEL: where[rack].hostname}
        assert "affinity" not in pod["spec"]
    unplaced = resources.pods(j, {"uid": "x"}, "img")
    assert all("affinity" in p["spec"] and "nodeSelector" not in p["spec"] for p in unplaced)
    assert placement.from_status({}) == {}
    assert "placement.json" not in resources.config_map(j, {"uid": "x"})["data"], \
        "nothing in the namespace says where the racks are"
