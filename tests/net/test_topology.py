"""Planning a topology from a spec: pure, no root needed."""

from tailcut import spec
from tailcut.net import naming, topology


def quickstart():
    return topology.plan(spec.load_file("examples/quickstart.yaml"))


def test_every_pod_gets_a_namespace_rack_slot_and_address_of_its_rack():
    topo = quickstart()
    w2 = topo.pod("worker-2")
    assert (w2.role, w2.index, w2.rack, w2.slot) == ("worker", 2, 1, 0)
    assert w2.netns == "tailcut-quickstart.worker-2"
    assert w2.ip == "10.2.0.2"
    assert topo.racks[1].gateway == "10.2.0.1"
    assert [p.ip for p in topo.racks[0].pods] == ["10.1.0.2", "10.1.0.3", "10.1.0.4"]


def test_every_namespace_carries_the_job_prefix_and_is_unique():
    names = quickstart().namespaces()
    assert len(names) == len(set(names)) == 1 + 2 + 5
    assert all(n.startswith(naming.job_prefix("quickstart")) for n in names)


def test_one_jobs_prefix_never_matches_another_jobs_namespaces():
    assert not naming.pod_netns("a-b", "ps-0").startswith(naming.job_prefix("a"))


def test_interface_names_fit_the_kernel_limit():
    longest = [naming.POD_IF, naming.TOR_BRIDGE, naming.RACK_UPLINK_IF,
               naming.rack_port(249), naming.spine_port(249)]
    assert max(len(n) for n in longest) <= naming.MAX_IFNAME


def test_background_pods_join_their_racks_after_the_training_pods():
    topo = topology.plan(spec.load_file("examples/quickstart-background.yaml"))
    assert [p.name for p in topo.racks[1].pods] == ["worker-2", "worker-3", "bg-server-0"]
    server = topo.pod("bg-server-0")
    assert (server.role, server.slot, server.ip) == ("bg-server", 2, "10.2.0.4")
    assert server.netns == "tailcut-quickstart-bg.bg-server-0"
    # ps-0 receives the flows itself: no client pod of its own
    assert [p.name for p in topo.racks[0].pods] == ["ps-0", "worker-0", "worker-1"]
    assert topology.background_pods(spec.load_file("examples/quickstart.yaml"), "rack-0") == []


def test_the_plan_carries_the_jobs_mtu_for_every_link():
    assert topology.plan(spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1",
                                         "kind": "TrainingJob", "metadata": {"name": "m"},
                                         "spec": {"network": {"mtu": 9000}}})).mtu == 9000
