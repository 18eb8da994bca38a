"""The sync modes' traits (tailcut.spec.sync_modes) are what the spec and the plan read."""

import typing

import pytest

from tailcut import plan, spec
from tailcut.errors import SpecError
from tailcut.spec import model, sync_modes


def test_the_specs_literal_and_the_crds_enum_name_the_registered_modes() -> None:
    literal = model.Training.model_fields["sync_mode"].annotation
    assert typing.get_args(literal) == sync_modes.NAMES == model.SYNC_MODES


def test_an_unknown_mode_is_named_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="syncMode 'gossip': one of bsp, async, ssp, allreduce"):
        sync_modes.get("gossip")


JOB = """\
apiVersion: tailcut.dev/v1alpha1
kind: TrainingJob
metadata: {{name: modes}}
spec:
  replicas: {{workers: 2}}
  training: {{model: {model}, syncMode: {mode}}}
  network:
    racks: [{{name: rack-0}}]
  transport: {{type: tcp}}
"""


@pytest.mark.parametrize("mode", sync_modes.NAMES)
def test_a_modes_pods_and_leader_follow_whether_it_has_a_ps(mode: str) -> None:
    torch = sync_modes.get(mode).torch_only
    job = spec.load_text(JOB.format(model="torch-mlp" if torch else "mlp", mode=mode))
    pods = job.spec.pod_names()
    if sync_modes.get(mode).has_ps:
        assert pods[0] == "ps-0" and plan.leader(job) == "ps-0"
    else:
        assert "ps-0" not in pods and plan.leader(job) == "worker-0"
    assert plan.needs_torch(job) == torch


def test_staleness_is_refused_naming_the_modes_that_take_it() -> None:
    text = JOB.format(model="mlp", mode="bsp").replace("syncMode: bsp",
                                                       "syncMode: bsp, staleness: 2")
    with pytest.raises(SpecError, match="applies only to syncMode: ssp, not bsp"):
        spec.load_text(text)
