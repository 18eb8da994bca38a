"""The TrainingJob spec: defaults, placement, and one readable error per bad input."""

import pytest

from tailcut import spec
from tailcut.errors import SpecError

HEADER = "apiVersion: tailcut.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: demo}\n"


def load(body: str) -> spec.TrainingJob:
    return spec.load_text(HEADER + body)


def error_of(body: str) -> str:
    with pytest.raises(SpecError) as info:
        load(body)
    return str(info.value)


def test_the_mtu_is_ethernets_1500_unless_the_network_sets_one():
    assert load("spec: {}").spec.network.mtu == 1500
    job = load("spec: {network: {mtu: 9000, uplink: {bufferBytes: 9014}}}")
    assert job.spec.network.mtu == 9000
    assert job.model_dump(by_alias=True)["spec"]["network"]["mtu"] == 9000


def test_an_empty_spec_gets_the_documented_defaults():
    job = load("spec: {}")
    s = job.spec
    assert (s.replicas.parameter_servers, s.replicas.workers) == (1, 2)
    assert s.training.model == "mlp" and s.training.sync_mode == "bsp"
    assert s.network.access_link.bandwidth == 10**9 and s.network.access_link.loss == 0
    assert s.transport.type == "tcp"
    assert [r.name for r in s.network.racks] == ["rack-0"]


def test_the_quickstart_example_is_valid():
    job = spec.load_file("examples/quickstart.yaml")
    assert job.name == "quickstart"
    assert job.spec.replicas.workers == 4 and len(job.spec.network.racks) == 2


def test_unplaced_pods_fill_racks_in_equal_contiguous_chunks():
    job = load("spec: {replicas: {workers: 3}, network: {racks: [{name: a}, {name: b}]}}")
    assert job.spec.rack_of() == {"ps-0": "a", "worker-0": "a", "worker-1": "b",
                                  "worker-2": "b"}


def test_explicit_placement_wins_and_the_rest_is_filled():
    job = load("spec: {replicas: {workers: 2}, network: {racks: [{name: a}, {name: b}],"
               " placement: {ps-0: b}}}")
    assert job.spec.rack_of()["ps-0"] == "b"


def test_buffers_are_unset_by_default_and_keep_their_unit():
    link = load("spec: {network: {uplink: {bufferBytes: 85000}}}").spec.network
    assert link.access_link.buffer_packets is None and link.access_link.buffer_bytes is None
    assert link.uplink.buffer_bytes == 85_000
    assert load("spec: {network: {accessLink: {bufferPackets: 8}}}").model_dump(
        by_alias=True)["spec"]["network"]["accessLink"]["bufferPackets"] == 8


def test_bandwidth_round_trips_in_tc_spelling():
    job = load("spec: {network: {uplink: {bandwidth: 2.5Gbit}}}")
    assert job.spec.network.uplink.bandwidth == 2_500_000_000
    assert job.model_dump(by_alias=True)["spec"]["network"]["uplink"]["bandwidth"] == "2500Mbit"


@pytest.mark.parametrize("body, field, words", [
    ("spec: {replicas: {wrokers: 3}}", "spec.replicas.wrokers", "did you mean workers"),
    ("spec: {replicas: {workers: 0}}", "spec.replicas.workers=0", "greater than or equal to 1"),
    ("spec: {replicas: {workers: '4'}}", "spec.replicas.workers='4'", "valid integer"),
    ("spec: {replicas: {workers: 2.5}}", "spec.replicas.workers=2.5", "integer"),
    ("spec: {network: {accessLink: {bandwidth: 10Gbps}}}",
     "spec.network.accessLink.bandwidth='10Gbps'", "bytes per second"),
    ("spec: {network: {accessLink: {bandwidth: '-1'}}}",
     "spec.network.accessLink.bandwidth='-1'", "must be positive"),
    ("spec: {network: {accessLink: {bandwidth: fast}}}",
     "spec.network.accessLink.bandwidth='fast'", "cannot be parsed"),
    ("spec: {network: {uplink: {bandwidth: 100}}}", "spec.network.uplink.bandwidth=100",
     "no unit"),
    ("spec: {network: {accessLink: {loss: 1.5}}}", "spec.network.accessLink.loss=1.5",
     "less than or equal to 1"),
    ("spec: {network: {accessLink: {loss: -0.1}}}", "spec.network.accessLink.loss=-0.1",
     "greater than or equal to 0"),
    ("spec: {network: {uplink: {delayMs: -5}}}", "spec.network.uplink.delayMs=-5",
     "greater than or equal to 0"),
    ("spec: {network: {uplink: {jitterMs: 3}}}", "spec.network.uplink.jitterMs",
     "needs delayMs > 0"),
    ("spec: {network: {uplink: {bufferPackets: 0}}}", "spec.network.uplink.bufferPackets=0",
     "at least 1 packet"),
    ("spec: {network: {accessLink: {bufferBytes: 1000}}}",
     "spec.network.accessLink.bufferBytes=1000", "one full-size Ethernet frame"),
    ("spec: {network: {accessLink: {bufferPackets: 8, bufferBytes: 20000}}}",
     "spec.network.accessLink.bufferBytes", "give bufferPackets or bufferBytes, not both"),
    ("spec: {network: {uplink: {bufferPackets: 2000000}}}",
     "spec.network.uplink.bufferPackets=2000000", "less than or equal to 1000000"),
    ("spec: {network: {mtu: 575}}", "spec.network.mtu=575", "greater than or equal to 576"),
    ("spec: {network: {mtu: 9001}}", "spec.network.mtu=9001", "less than or equal to 9000"),
    ("spec: {network: {mtu: '9000'}}", "spec.network.mtu='9000'", "valid integer"),
    ("spec: {network: {mtu: 9000, uplink: {bufferBytes: 5000}}}", "spec.network",
     "uplink.bufferBytes: 5000 is less than one full-size frame at mtu 9000 (9014 bytes)"),
    ("spec: {network: {placement: {worker-0: rack-9}}}",
     "spec.network.placement.worker-0", "rack 'rack-9' does not exist"),
    ("spec: {network: {placement: {worker-7: rack-0}}}",
     "spec.network.placement.worker-7", "pod 'worker-7' does not exist"),
    ("spec: {network: {racks: [{name: a}, {name: a}]}}", "spec.network.racks",
     "repeated: a"),
    ("spec: {network: {racks: []}}", "spec.network.racks", "at least 1"),
    ("spec: {transport: {type: quic}}", "spec.transport.type='quic'", "supported: tcp"),
    ("spec: {training: {syncMode: hogwild}}", "spec.training.syncMode='hogwild'", "'ssp'"),
    ("spec: {training: {staleness: 2}}", "spec", "applies only to syncMode: ssp"),
    ("spec: {training: {aggregation: median}}", "spec.training.aggregation='median'",
     "'mean' or 'unbiased'"),
    ("spec: {training: {aggregation: unbiased, syncMode: ssp}}", "spec",
     "training.aggregation: unbiased combines a bsp iteration's pushes, so it needs "
     "syncMode: bsp, not ssp"),
    ("spec: {replicas: {aggregators: [{workers: [0, 5]}]}}", "spec.replicas",
     "worker 5 does not exist"),
    ("spec: {replicas: {aggregators: [{workers: [0]}, {workers: [0]}]}}", "spec.replicas",
     "already served by aggregators[0]"),
    ("spec: {replicas: {workers: 2, aggregators: [{workers: [0]}]}, training: {syncMode: async}}",
     "spec", "need bsp"),
    ("spec: {training: {model: resnet}}", "spec.training.model='resnet'", "known: cnn, deep-mlp, even-mlp, mf, mlp"),
    ("spec: {training: {learningRate: 0}}", "spec.training.learningRate=0", "greater than 0"),
    ("spec: {training: {targetAccuracy: 1.2}}", "spec.training.targetAccuracy=1.2",
     "less than or equal to 1"),
    ("spec: {replicas: {parameterServers: 0}}", "spec.replicas.parameterServers=0",
     "greater than or equal to 1"),
    ("spec: {replicas: {parameterServers: 2, psReplica: true}}", "spec.replicas",
     "a replica needs parameterServers: 1"),
])
def test_invalid_input_is_rejected_naming_the_field(body, field, words):
    message = error_of(body)
    assert field in message
    assert words in message


def test_wrong_kind_and_api_version_are_named():
    with pytest.raises(SpecError, match="kind='Job'"):
        spec.load_text("apiVersion: tailcut.dev/v1alpha1\nkind: Job\nmetadata: {name: a}\n")
    with pytest.raises(SpecError, match="apiVersion='v1'"):
        spec.load_text("apiVersion: v1\nkind: TrainingJob\nmetadata: {name: a}\n")


def test_a_job_name_that_is_not_a_dns_label_is_refused():
    with pytest.raises(SpecError, match="metadata.name='Big_Job'"):
        spec.load_text("kind: TrainingJob\nmetadata: {name: Big_Job}\n")


def test_metadata_is_required():
    with pytest.raises(SpecError, match="metadata: required field is missing"):
        spec.load_text("kind: TrainingJob\nspec: {}\n")


def test_several_errors_are_all_reported_at_once():
    message = error_of("spec: {replicas: {workers: 0}, network: {uplink: {loss: 2}}}")
    assert "spec.replicas.workers" in message and "spec.network.uplink.loss" in message


def test_broken_yaml_and_multiple_documents_are_refused():
    with pytest.raises(SpecError, match="not valid YAML"):
        spec.load_text("spec: {replicas: [")
    with pytest.raises(SpecError, match="exactly one TrainingJob document, found 2"):
        spec.load_text(HEADER + "---\n" + HEADER)


def test_a_missing_file_is_named():
    with pytest.raises(SpecError, match="nope.yaml: cannot read"):
        spec.load_file("nope.yaml")


def test_a_job_with_every_role_names_its_pods_and_keeps_the_sync_settings():
    job = load("spec: {replicas: {parameterServers: 1, workers: 4, psReplica: true,"
               " aggregators: [{workers: [2, 3]}]},"
               " training: {syncMode: bsp, ordering: stf, connectionWindowUs: 500}}")
    assert job.spec.pod_names() == ["ps-0", "worker-0", "worker-1", "worker-2", "worker-3",
                                    "replica-0", "aggregator-0"]
    assert job.spec.training.ordering == "stf"
    assert job.spec.training.connection_window_us == 500
    ssp = load("spec: {replicas: {parameterServers: 3}, training: {syncMode: ssp, staleness: 2}}")
    assert ssp.spec.pod_names()[:3] == ["ps-0", "ps-1", "ps-2"]
    assert (ssp.spec.training.sync_mode, ssp.spec.training.staleness) == ("ssp", 2)
def test_every_registered_model_is_valid_in_a_training_job():
    # The spec asks the training registry, so a new model needs no second list.
    from tailcut.ml import models
    for name in models.names():
        job = spec.load_text(HEADER + f"spec: {{training: {{model: {name}}}}}\n")
        assert job.spec.training.model == name
