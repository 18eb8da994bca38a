"""Enforcement of the scheduling policy: what it refuses and how weights map to levels."""

import pytest

from tailcut import spec
from tailcut.errors import SpecError
from tailcut.net import topology
from tailcut.scheduling import enforce, runnable
from tailcut.spec.model import Link


def _job(scheduling: dict) -> spec.TrainingJob:
    return spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                           "metadata": {"name": "cf-enforce"},
                           "spec": {"scheduling": scheduling}})


def test_fair_adds_nothing_to_any_pod():
    job = _job({"policy": "fair"})
    handle = enforce.apply(topology.plan(job), job.spec.scheduling)
    assert handle.classifiers == [] and handle.applied == {}


def test_coflow_adds_nothing_to_any_pod_because_the_senders_pace():
    job = _job({"policy": "coflow"})
    handle = enforce.apply(topology.plan(job), job.spec.scheduling)
    assert handle.policy == "coflow"
    assert handle.classifiers == [] and handle.applied == {}


def test_hand_written_weights_become_one_weight_per_level():
    job = _job({"policy": "cadentflow", "priorityLevels": 3,
                "flows": [{"layer": "W1", "priority": 0, "weight": 3},
                          {"layer": "b1", "priority": 2, "weight": 0.5}]})
    assert enforce.weights_of(job.spec.scheduling) == [3.0, 1.0, 0.5]


def test_no_weights_means_strict_priority():
    job = _job({"policy": "cadentflow", "flows": [{"layer": "W1", "priority": 0}]})
    assert enforce.weights_of(job.spec.scheduling) is None


def _run_job(scheduling: dict, **spec_extra: object) -> spec.TrainingJob:
    return spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                           "metadata": {"name": "cf-enforce"},
                           "spec": {"scheduling": scheduling, **spec_extra}})


def test_tailcut_run_accepts_every_policy_over_tcp():
    for policy in ("fair", "coflow", "cadentflow"):
        job = _run_job({"policy": policy})
        runnable.check_runnable(job.spec.scheduling, job)


def test_coflow_over_a_datagram_transport_is_refused_naming_both_fields():
    for transport in ({"type": "udp"}, {"type": "bounded-loss", "p": 0.9},
                      {"type": "app-drop", "p": 0.1}):
        job = _run_job({"policy": "coflow"}, transport=transport)
        with pytest.raises(SpecError, match="spec.scheduling.policy='coflow' with "
                                            f"spec.transport.type='{transport['type']}'"):
            runnable.check_runnable(job.spec.scheduling, job)


def test_coflow_with_aggregators_or_a_replica_is_refused_naming_the_fields():
    for replicas in ({"workers": 2, "aggregators": [{"workers": [0, 1]}]},
                     {"workers": 2, "psReplica": True}):
        job = _run_job({"policy": "coflow"}, replicas=replicas)
        with pytest.raises(SpecError, match="policy='coflow' with spec.replicas.aggregators "
                                            "or spec.replicas.psReplica"):
            runnable.check_runnable(job.spec.scheduling, job)


def test_cadentflow_runs_over_the_datagram_transports_and_app_drop_is_refused_by_name():
    for transport in ({"type": "udp"}, {"type": "bounded-loss", "p": 0.9}):
        job = _run_job({"policy": "cadentflow"}, transport=transport)
        runnable.check_runnable(job.spec.scheduling, job)
    job = _run_job({"policy": "cadentflow"}, transport={"type": "app-drop", "p": 0.9})
    with pytest.raises(SpecError, match="policy='cadentflow' with spec.transport.type="
                                        "'app-drop'"):
        runnable.check_runnable(job.spec.scheduling, job)


def test_cadentflow_with_aggregators_or_a_replica_is_refused_naming_the_fields():
    for replicas in ({"workers": 2, "aggregators": [{"workers": [0, 1]}]},
                     {"workers": 2, "psReplica": True}):
        job = _run_job({"policy": "cadentflow"}, replicas=replicas)
        with pytest.raises(SpecError, match="spec.replicas.aggregators or "
                                            "spec.replicas.psReplica"):
            runnable.check_runnable(job.spec.scheduling, job)


def test_apply_to_chosen_egresses_adds_nothing_for_fair():
    # (no namespace is entered: fair adds nothing, so the egress need not exist)
    assert enforce.apply_to([("tailcut-ks-none", "eth0", Link(bandwidth="100Mbit"))],
                            _job({"policy": "fair"}).spec.scheduling).classifiers == []
