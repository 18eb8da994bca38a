"""tailcut.plan: one translation of a TrainingJob for both executors. The same job
gives the same roles under `tailcut run` and on Kubernetes (the agent gives a pod the
address the topology plans for it), and each executor's refusals name their field."""

import platform
from pathlib import Path

import pytest

from tailcut import cli, features, plan, spec, transports
from tailcut.errors import SpecError
from tailcut.ml import models, torchmodel
from tailcut.net import topology
from tailcut.transports import sender

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def job(name="pl-job", **job_spec):
    return spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                           "metadata": {"name": name}, "spec": job_spec})


SHARDED = dict(replicas={"parameterServers": 2, "workers": 4,
                         "aggregators": [{"workers": [2, 3]}]},
               network={"racks": [{"name": "r0"}, {"name": "r1"}]})


def test_every_peer_is_its_address_on_the_jobs_links_and_a_listener_binds_its_own():
    sharded = job(**SHARDED)
    topo = topology.plan(sharded)
    worker = plan.role_config(sharded, "worker-0", "/r", plan.hosts(topo))
    assert worker.shard_endpoints == [f"{topo.pod('ps-0').ip}:7000",
                                      f"{topo.pod('ps-1').ip}:7000"]
    assert worker.ps_host == topo.pod("ps-0").ip
    shard1 = plan.role_config(sharded, "ps-1", "/r", plan.hosts(topo))
    assert (shard1.role, shard1.index) == ("ps", 1)
    assert shard1.shard_endpoints[1] == f"{topo.pod('ps-1').ip}:7000"
    aggregator = plan.role_config(sharded, "aggregator-0", "/r", plan.hosts(topo))
    assert aggregator.aggregators[0]["endpoint"] == f"{topo.pod('aggregator-0').ip}:7000"


def test_the_aggregation_rule_reaches_every_role_and_defaults_to_the_mean():
    topo = topology.plan(job(**SHARDED))
    unbiased = job(training={"aggregation": "unbiased"}, **SHARDED)
    for pod in ("ps-0", "ps-1", "worker-0", "aggregator-0"):
        assert plan.role_config(unbiased, pod, "/r", plan.hosts(topo)).aggregation == "unbiased"
    assert plan.role_config(job(), "ps-0", "/r", plan.hosts(topology.plan(job()))
                            ).aggregation == "mean"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_runs_on_both_executors_and_torch_ones_say_they_need_torch(example):
    """Whether a cluster has the worker image with PyTorch is the chart's (the
    operator refuses torch jobs naming workers.torchImage when it has none)."""
    loaded = spec.load_file(example)
    assert plan.refusals(loaded, "local") == []
    assert plan.refusals(loaded, "kubernetes") == []
    t = loaded.spec.training
    assert plan.needs_torch(loaded) == (models.is_torch(t.model_ref)
                                        or t.sync_mode == "allreduce")
    assert plan.needs_torch(loaded) == (example.stem in ("quickstart-torch",
                                                         "allreduce-gloo",
                                                         "allreduce-bounded-loss"))


@pytest.mark.parametrize("transport", [{"type": "tcp"}, {"type": "app-drop", "p": 0.9}])
def test_tcp_and_app_drop_run_on_kubernetes_with_every_role(transport):
    plan.check(job(transport=transport, **SHARDED), "kubernetes")
    plan.check(job(transport=transport, replicas={"workers": 2, "psReplica": True}),
               "kubernetes")


@pytest.mark.parametrize("transport", [{"type": "udp"}, {"type": "bounded-loss", "p": 0.9}])
def test_the_datagram_transports_run_on_kubernetes(transport):
    datagram = job(transport=transport, **SHARDED)
    plan.check(datagram, "kubernetes")
    assert plan.needs_xdp(datagram) == (transport["type"] == "bounded-loss")


def test_what_tailcut_run_refuses_is_refused_on_both_with_the_same_words():
    bad = job(transport={"type": "app-drop", "p": 0.9}, scheduling={"policy": "cadentflow"})
    local, kubernetes = plan.refusals(bad, "local"), plan.refusals(bad, "kubernetes")
    assert local and local == kubernetes
    assert local[0].field == "spec.scheduling.policy"
    assert "spec.transport.type='app-drop'" in local[0].message


def test_an_unknown_executor_is_a_programming_error():
    with pytest.raises(ValueError, match="unknown executor 'slurm'"):
        plan.refusals(job(), "slurm")


def test_coflow_rates_are_not_shared_between_jobs_on_different_links():
    """The flows are cached (resolving builds the model); the key is the whole spec,
    so a long-lived operator does not pace a 100 Mbit/s job at a 1 Gbit/s job's rates."""
    def coflow(bandwidth):
        return job(scheduling={"policy": "coflow"},
                   network={"accessLink": {"bandwidth": bandwidth}})
    fast, slow = plan.role_flows(coflow("1Gbit")), plan.role_flows(coflow("100Mbit"))
    assert fast["pace"] != slow["pace"]
    assert plan.role_flows(coflow("1Gbit")) is fast


@pytest.mark.parametrize("transport", ["udp", "bounded-loss"])
def test_the_datagram_transports_size_their_packets_by_the_jobs_mtu(transport):
    kind = {"type": transport} | ({"p": 0.9} if transport == "bounded-loss" else {})
    jumbo = job(network={"mtu": 9000}, transport=kind)
    pod = topology.plan(jumbo).pod("worker-0")
    assert plan.transport_options(jumbo, pod)["mtu"] == 9000
    default = job(transport=kind)
    assert plan.transport_options(default, topology.plan(default).pod("ps-0"))["mtu"] == 1500


@pytest.mark.parametrize("transport", ["tcp", "app-drop"])
def test_the_stream_transports_take_no_mtu(transport):
    kind = {"type": transport} | ({"p": 0.9} if transport == "app-drop" else {})
    jumbo = job(network={"mtu": 9000}, transport=kind)
    assert "mtu" not in plan.transport_options(jumbo, topology.plan(jumbo).pod("ps-0"))


@pytest.mark.parametrize("transport", ["udp", "bounded-loss"])
def test_senders_burst_whole_gso_messages_only_where_no_switch_buffer_is_finite(transport):
    """A finite switch buffer anywhere (access links or uplinks) keeps the senders'
    bursts small (tailcut.transports.sender.burst_floor); random loss does not."""
    kind = {"type": transport} | ({"p": 0.9} if transport == "bounded-loss" else {})
    for network, whole in (({}, True), ({"uplink": {"loss": 0.01}}, True),
                           ({"accessLink": {"loss": 0.01}}, True),
                           ({"accessLink": {"bufferBytes": 85000}}, False),
                           ({"uplink": {"bufferPackets": 64}}, False),
                           ({"accessLink": {"delayMs": 5}}, True)):
        j = job(network=network, transport=kind)
        options = plan.transport_options(j, topology.plan(j).pod("worker-0"))
        t = transports.get(options["type"], **{k: v for k, v in options.items()
                                               if k != "type"})
        t.close()  # (its eventfd)
        assert (t.burst_packets > sender.BURST_PACKETS) is whole, network


def test_the_senders_know_the_shallowest_switch_buffer_on_the_path() -> None:
    """It bounds a message's start credit (tailcut.transports.sender)."""
    kind = {"type": "bounded-loss", "p": 0.9}
    for network, smallest in (({}, None), ({"accessLink": {"bufferBytes": 85000}}, 85000),
                              ({"accessLink": {"bufferBytes": 85000},
                                "uplink": {"bufferPackets": 20}}, 20 * 1514)):
        j = job(network=network, transport=kind)
        options = plan.transport_options(j, topology.plan(j).pod("worker-0"))
        assert options["switch_buffer_bytes"] == smallest, network


@pytest.mark.parametrize("transport", ["udp", "bounded-loss"])
def test_datagram_transports_use_udp_gso_on_lossy_paths_too(transport):
    """Loss and buffers act past the kernel's cut of a GSO message (net/build.py's
    gso_max_segs, and a pod's own direction loses at its switch port's ingress)."""
    kind = {"type": transport} | ({"p": 0.9} if transport == "bounded-loss" else {})
    for network, gso in (({}, True), ({"uplink": {"loss": 0.01}}, True),
                         ({"accessLink": {"bufferBytes": 85000}}, True),
                         ({"accessLink": {"loss": 0.01}}, True)):
        j = job(network=network, transport=kind)
        assert plan.transport_options(j, topology.plan(j).pod("worker-0"))["gso"] is gso, network


@pytest.mark.parametrize("transport", ["udp", "bounded-loss"])
def test_datagram_transports_are_told_their_links_rate_rather_than_reading_it_back(transport):
    """Every pod's own end is shaped at the access link's rate: the grants and the
    pacing start from it without a netlink dump in each role."""
    kind = {"type": transport} | ({"p": 0.9} if transport == "bounded-loss" else {})
    j = job(network={"accessLink": {"bandwidth": "250Mbit"}}, transport=kind)
    options = plan.transport_options(j, topology.plan(j).pod("ps-0"))
    assert options["link_bit"] == 250e6
    assert transports.get(options.pop("type"), **options).link_bit == 250e6  # type: ignore[attr-defined]


torch_installed = pytest.mark.skipif(not torchmodel.available(),
                                     reason="PyTorch is not installed (scripts/setup.sh)")


@torch_installed
def test_an_allreduce_job_plans_workers_that_meet_at_worker_0():
    ar = job(replicas={"workers": 3}, training={"model": "torch-mlp", "syncMode": "allreduce"},
             network={"racks": [{"name": "r0"}, {"name": "r1"}]})
    topo = topology.plan(ar)
    assert [p.name for p in topo.pods] == ["worker-0", "worker-1", "worker-2"]
    assert plan.leader(ar) == "worker-0"
    for name in ("worker-0", "worker-2"):
        cfg = plan.role_config(ar, name, "/r", plan.hosts(topo))
        assert (cfg.sync_mode, cfg.model) == ("allreduce", "torch-mlp")
        assert (cfg.ps_host, cfg.ps_port) == (topo.pod("worker-0").ip, 29500)
    assert plan.refusals(ar, "kubernetes") == [] and plan.needs_torch(ar)


@torch_installed
def test_allreduce_over_bounded_loss_plans_one_shard_endpoint_per_rank():
    ar = job(replicas={"workers": 3}, training={"model": "torch-mlp", "syncMode": "allreduce"},
             transport={"type": "bounded-loss", "p": 0.8},
             network={"racks": [{"name": "r0"}, {"name": "r1"}],
                      "placement": {"worker-0": "r1", "worker-1": "r0", "worker-2": "r1"}})
    topo = topology.plan(ar)
    cfg = plan.role_config(ar, "worker-1", "/r", plan.hosts(topo))
    assert cfg.shard_endpoints == [f"{topo.pod(f'worker-{i}').ip}:{plan.PS_PORT}"
                                   for i in range(3)]
    assert cfg.transport["type"] == "bounded-loss" and cfg.transport["p"] == 0.8
    assert cfg.rank_racks == [1, 0, 1]   # each rank's rack (training.relay)
    assert plan.needs_xdp(ar) and plan.needs_torch(ar)
    with pytest.raises(SpecError, match="spec.transport.type: allreduce runs Gloo over tcp, or "
                       "tailcut's transpose all-reduce over bounded-loss or udp, not app-drop"):
        job(training={"model": "torch-mlp", "syncMode": "allreduce"},
            transport={"type": "app-drop", "p": 0.9})


@torch_installed
def test_cadentflow_tags_a_torch_model_one_parameter_tensor_at_a_time():
    cf = job(training={"model": "torch-mlp"},
             scheduling={"policy": "cadentflow",
                         "flows": [{"layer": "fc2.bias", "priority": 0}]})
    flows = plan.role_flows(cf)
    assert set(flows["push"]) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    assert flows["push"]["fc2.bias"] == 0


def test_a_jobs_flows_stay_cached_while_other_jobs_come_and_go():
    """A full cache drops its least recently used spec, not every spec (clearing it made
    the next lookup of a job in use rebuild its model)."""
    kept = job(name="kept", scheduling={"policy": "coflow"})
    first = plan.role_flows(kept)
    for n in range(plan.CACHED_SPECS + 5):
        other = job(name=f"other-{n}", training={"seed": n + 1},
                    scheduling={"policy": "coflow"})
        plan.role_flows(other)
        assert plan.role_flows(kept) is first   # used again each time: never the oldest


# What features.netem() answers on the two kinds of kernel, and without root.
NO_NETEM = features.Feature("netem", False, "adding a netem qdisc to a veth failed with "
                            "ENOENT: the kernel has no netem qdisc", "delay is refused")
NETEM = features.Feature("netem", True, "added a netem qdisc to a veth", "delay by netem")
NOT_PROBED = features.Feature("netem", False, "not probed: needs root", "delay is refused",
                              probed=False)


def never_probed() -> features.Feature:
    raise AssertionError("a job without delay must not probe the kernel")


@pytest.mark.parametrize("network, field", [
    ({"accessLink": {"delayMs": 1}}, "spec.network.accessLink.delayMs=1"),
    ({"uplink": {"delayMs": 0.05, "jitterMs": 0.01}}, "spec.network.uplink.delayMs=0.05"),
    ({"accessLink": {"delayMs": 2, "jitterMs": 1}}, "spec.network.accessLink.delayMs=2")])
def test_a_delay_is_refused_before_anything_is_built_where_the_kernel_has_no_netem(
        network, field):
    delayed = job(network=network)
    found = plan.refusals(delayed, "local", netem=lambda: NO_NETEM)
    assert [r.field for r in found] == [field.split("=")[0]]
    message = found[0].message
    assert message.startswith(f"{field}: this kernel (Linux {platform.release()}) has no "
                              "netem qdisc (adding a netem qdisc to a veth failed with ENOENT")
    assert "set it to 0, or run on a kernel with netem" in message


def test_a_delay_runs_where_the_kernel_has_netem_and_on_kubernetes_the_node_decides():
    delayed = job(network={"accessLink": {"delayMs": 5}, "uplink": {"delayMs": 0.02}})
    assert plan.refusals(delayed, "local", netem=lambda: NETEM) == []
    assert plan.refusals(delayed, "kubernetes", netem=lambda: NO_NETEM) == []
    assert plan.cautions(delayed, netem=lambda: NETEM) == []


def test_a_job_without_delay_never_probes_the_kernel():
    lossy = job(network={"accessLink": {"loss": 0.01}})
    assert plan.refusals(lossy, "local", netem=never_probed) == []
    assert plan.cautions(lossy, netem=never_probed) == []


def test_a_delay_that_could_not_be_probed_without_root_is_a_caution_not_a_refusal():
    delayed = job(network={"uplink": {"delayMs": 3}})
    assert plan.refusals(delayed, "local", netem=lambda: NOT_PROBED) == []
    cautions = plan.cautions(delayed, netem=lambda: NOT_PROBED)
    assert [c.field for c in cautions] == ["spec.network.uplink.delayMs"]
    assert "was not probed (the probe needs root)" in cautions[0].message
    assert plan.cautions(delayed, "kubernetes", netem=never_probed) == []


def test_without_a_probe_a_delay_is_left_to_the_build_and_cautioned():
    # The plan imports no probe (it needs netlink and root): the local executor passes
    # features.netem; a caller without one gets the unprobed case, never a guess.
    delayed = job(network={"uplink": {"delayMs": 3}})
    assert plan.refusals(delayed, "local") == []
    assert [c.field for c in plan.cautions(delayed)] == ["spec.network.uplink.delayMs"]


@pytest.mark.netns
def test_validate_refuses_a_delay_exactly_where_this_kernel_lacks_netem(tmp_path, capsys):
    """The real probe, whichever kernel this is: the host's (no netem) refuses, the
    user-mode Linux one (tests/uml) accepts."""
    features.clear_cache()
    path = tmp_path / "delayed.yaml"
    path.write_text("apiVersion: tailcut.dev/v1alpha1\nkind: TrainingJob\n"
                    "metadata: {name: delayed}\nspec:\n  network:\n"
                    "    accessLink: {delayMs: 1}\n")
    has_netem = features.netem().available
    assert cli.main(["validate", str(path)]) == (0 if has_netem else 2)
    out = capsys.readouterr()
    if has_netem:
        assert f"{path}: ok (local)" in out.out
    else:
        assert (f"{path}: spec.network.accessLink.delayMs=1: this kernel (Linux "
                f"{platform.release()}) has no netem qdisc") in out.err


@pytest.mark.parametrize("network, field", [
    ({"accessLink": {"loss": 1}}, "spec.network.accessLink.loss"),
    ({"uplink": {"loss": 1.0}}, "spec.network.uplink.loss")])
def test_a_link_that_drops_every_packet_is_a_caution(network, field):
    found = plan.cautions(job(network=network), netem=never_probed)
    assert [c.field for c in found] == [field]
    assert found[0].message.startswith(f"{field}=1: every packet is dropped")
    assert plan.cautions(job(network={"uplink": {"loss": 0.99}}), netem=never_probed) == []


def test_a_rack_no_pod_is_placed_in_is_a_caution():
    racks = [{"name": "r0"}, {"name": "r1"}, {"name": "r2"}]
    few = job(replicas={"workers": 1}, network={"racks": racks})   # ps-0, worker-0
    found = plan.cautions(few, netem=never_probed)
    assert [c.field for c in found] == ["spec.network.racks[2]"]
    assert "spec.network.racks[2] (r2): no pod is in this rack" in found[0].message
    placed = job(replicas={"workers": 2}, network={
        "racks": racks[:2], "placement": {"ps-0": "r1", "worker-0": "r1", "worker-1": "r1"}})
    assert [c.field for c in plan.cautions(placed, netem=never_probed)] == [
        "spec.network.racks[0]"]
    assert plan.cautions(job(**SHARDED), netem=never_probed) == []


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_no_example_draws_a_caution(example):
    assert plan.cautions(spec.load_file(example), netem=never_probed) == []


def test_links_faster_than_the_hosts_cores_drive_are_a_caution_pointing_at_calibrate():
    fast = job(network={"accessLink": {"bandwidth": "10Gbit"}})
    found = plan.cautions(fast, netem=never_probed, cores=2)
    assert [c.field for c in found] == ["spec.network.accessLink.bandwidth"]
    assert "10000Mbit: faster than this host's 2 core(s)" in found[0].message
    assert "tailcut calibrate" in found[0].message
    assert plan.cautions(fast, netem=never_probed, cores=32) == []
    assert plan.cautions(fast, "kubernetes", netem=never_probed, cores=2) == []
    assert plan.cautions(job(), netem=never_probed, cores=2) == []   # 1 Gbit/s on 2 cores


@pytest.mark.parametrize("extra, field", [
    ({"scheduling": {"policy": "cadentflow", "priorityLevels": 2,
                     "flows": [{"layer": "fc1", "priority": 0}]}}, "spec.scheduling.policy"),
    ({"scheduling": {"policy": "coflow"}}, "spec.scheduling.policy"),
    ({"network": {"inNetwork": {"aggregate": True}}}, "spec.network.inNetwork"),
])
def test_on_kubernetes_what_would_build_a_tenants_module_in_the_operator_is_refused(
        tmp_path, extra, field):
    """The operator imports no tenant's module: a schedule or ToR program that needs the
    model planned is refused there, naming the field and the module, and nothing is
    imported on the way (the module would leave a marker)."""
    marker = tmp_path / "imported"
    tenant = tmp_path / "tenant.py"
    tenant.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    raw = {"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
           "metadata": {"name": "tenant"},
           "spec": {"training": {"model": "torch", "module": f"{tenant}:build"}, **extra}}
    job = spec.from_dict(raw, import_modules=False)
    refused = plan.refusals(job, "kubernetes")
    assert [r.field for r in refused] == [field]
    assert "imports no tenant's module" in refused[0].message
    assert f"{tenant}:build" in refused[0].message
    assert not marker.exists()
    # a plain job of the same module plans without the model
    plain = spec.from_dict({**raw, "spec": {"training": raw["spec"]["training"]}},
                           import_modules=False)
    assert plan.refusals(plain, "kubernetes") == [] and not marker.exists()
