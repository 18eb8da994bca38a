"""What the Kubernetes path does with spec.scheduling: the operator's refusals (the
plan's), each naming the field, and the per-tensor tags the pods get from the config
map."""

import json

import pytest

from tailcut import plan, spec
from tailcut.errors import SpecError
from tailcut.k8s.manifests import policy
from tailcut.scheduling import flowreport


def job(scheduling, **extra):
    return spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                           "metadata": {"name": "ks-policy"},
                           "spec": {"training": {"model": "deep-mlp"},
                                    "scheduling": scheduling, **extra}})


def test_fair_and_cadentflow_pass_the_check():
    plan.check(job({"policy": "fair"}), "kubernetes")
    plan.check(job({"policy": "cadentflow"}), "kubernetes")


def test_coflow_passes_and_its_pods_get_their_madd_rates():
    coflow = job({"policy": "coflow"}, replicas={"workers": 2})
    plan.check(coflow, "kubernetes")
    pace = json.loads(policy.config_data(coflow)[policy.FLOWS_KEY])["pace"]
    assert set(pace["ps-0"]) == {"worker-0", "worker-1"}   # payload bytes/s per flow
    assert all(rate > 0 for rates in pace.values() for rate in rates.values())


def test_cadentflow_over_app_drop_is_refused_naming_both_fields():
    with pytest.raises(SpecError, match=r"spec.scheduling.policy='cadentflow' with "
                                        r"spec.transport.type='app-drop'"):
        plan.check(job({"policy": "cadentflow"}, transport={"type": "app-drop", "p": 0.9}),
                   "kubernetes")


def test_a_tag_for_a_tensor_the_model_lacks_is_refused_naming_the_tag():
    with pytest.raises(SpecError, match=r"spec.scheduling.flows\[0\].layer='conv9'"):
        plan.check(job({"policy": "cadentflow", "flows": [{"layer": "conv9",
                                                           "priority": 0}]}), "kubernetes")


def test_the_config_map_gives_the_pods_what_tailcut_run_gives_its_roles():
    for scheduling in ({"policy": "fair"},
                       {"policy": "cadentflow", "priorityLevels": 2,
                        "flows": [{"layer": "fc4.weight", "direction": "pull",
                                   "priority": 0}]}):
        j = job(scheduling)
        flows = json.loads(policy.config_data(j)[policy.FLOWS_KEY])
        assert flows == flowreport.role_flows(j)
    assert flows["pull"]["fc1.weight"] == 0 and flows["pull"]["fc4.weight"] == 0
    assert flows["pull"]["fc3.weight"] == 1 and set(flows["push"]) == set(flows["pull"])
