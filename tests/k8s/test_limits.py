"""What a job may ask of a node's kernel: a job past a limit is refused naming the
field and the limit; a cluster admin moves a limit for one namespace."""

import pytest

from tailcut import spec
from tailcut.k8s.manifests import limits


def job(**job_spec):
    return spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                           "metadata": {"name": "k8-limits"}, "spec": job_spec})


def test_a_gigabyte_buffer_on_a_slow_uplink_is_refused_naming_the_field_and_the_limit():
    deep = job(network={"uplink": {"bandwidth": "8kbit", "bufferBytes": 1_000_000_000}})
    said = limits.refusal(deep, 1, limits.Limits())
    assert said.startswith("spec.network.uplink.bufferBytes: a link end's "
                           "queues may hold 1338177024 bytes of kernel memory, above the "
                           "limit of 67108864 per link end")
    assert "tailcut.dev/max-link-queue-bytes" in said


def test_the_queues_of_a_default_cadentflow_job_are_counted_end_by_end():
    """5 pods on one rack, 4 classes: (5 x 2 + 2) ends x 4 x 1000 x (1514 + 512) bytes."""
    flows = job(replicas={"workers": 4}, scheduling={"policy": "cadentflow"})
    asked = limits.ask(flows, 1)
    assert asked.job_queue_bytes == 12 * 4 * 1000 * 2026
    assert asked.links == 6
    assert limits.refusal(flows, 1, limits.Limits()) is None


def test_a_job_past_its_namespaces_limits_is_refused_and_within_them_is_not():
    eight = job(replicas={"workers": 7}, network={"racks": [{"name": f"r{i}"} for i in range(8)]})
    tight = limits.Limits(racks_per_node=4)
    assert limits.refusal(eight, 8, tight).startswith(
        "spec.network.racks: 8 racks would be built on one node, above the limit of 4 per "
        "node")
    assert limits.refusal(eight, limits.racks_per_node(8, {f"r{i}": f"n{i % 2}"
                                                           for i in range(8)}), tight) is None
    assert limits.refusal(eight, 1, limits.Limits(links_per_job=10)).startswith(
        "spec.replicas: the job has 16 links (one per pod, one per rack), above the limit "
        "of 10 per job")
    assert limits.refusal(eight, 1, limits.Limits(job_queue_bytes=10**6)).startswith(
        "spec.network: the job's link queues may hold")
    raised = limits.Limits(racks_per_node=4).overridden(
        {"tailcut.dev/max-racks-per-node": "8", "other": "x"}, "namespace lab's annotation")
    assert limits.refusal(eight, 8, raised) is None


def test_cadentflow_classes_each_with_a_deep_queue_are_counted_per_class():
    deep = job(network={"accessLink": {"bufferPackets": 5000}},
               scheduling={"policy": "cadentflow", "priorityLevels": 8})
    said = limits.refusal(deep, 1, limits.Limits())
    assert said.startswith(f"spec.network.accessLink.bufferPackets: a link end's queues may "
                           f"hold {8 * 5000 * 2026} bytes of kernel memory (8 cadentflow "
                           "classes, each with its queue)")


def test_a_limit_that_is_no_count_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"namespace lab's annotation "
                                         r"tailcut.dev/max-job-queue-bytes='lots': must be"):
        limits.Limits().overridden({"tailcut.dev/max-job-queue-bytes": "lots"},
                                   "namespace lab's annotation")
    assert limits.Limits().overridden({"linkQueueBytes": 5}, "x").link_queue_bytes == 5
