"""A real `tailcut run` under cadentflow computes layer by layer and trains like fair."""

import csv
from pathlib import Path

import pytest

from tailcut import spec
from tailcut.runtime import local
from tests.runtime.runs import nothing_of

pytestmark = [pytest.mark.netns, pytest.mark.bpf, pytest.mark.e2e]

JOB = """\
apiVersion: tailcut.dev/v1alpha1
kind: TrainingJob
metadata: {{name: {name}}}
spec:
  replicas: {{workers: 2, parameterServers: 2}}
  training: {{model: deep-mlp, batchSize: 64, learningRate: 0.1, epochs: 2,
             targetAccuracy: null, seed: 3, timeoutS: 120}}
  network:
    racks: [{{name: a}}]
    accessLink: {{bandwidth: 500Mbit}}
  scheduling: {{policy: {policy}}}
"""


def _losses(results: Path) -> list[tuple[float, float]]:
    with open(results / "epochs.csv", newline="") as f:
        return [(float(r["train_loss"]), float(r["test_loss"])) for r in csv.DictReader(f)]


def test_a_layerwise_cadentflow_run_follows_the_fair_runs_loss_trajectory(tmp_path):
    for policy, name in (("fair", "lw-fair"), ("cadentflow", "lw-cf")):
        result = local.run(spec.load_text(JOB.format(name=name, policy=policy)),
                           tmp_path / policy, progress=lambda _: None)
        nothing_of(name)
        assert result.epochs == 2
    fair, cf = _losses(tmp_path / "fair"), _losses(tmp_path / "cadentflow")
    assert len(fair) == len(cf) == 2
    # Same seed and minibatches, the same float operations stage by stage.
    for (f_train, f_test), (c_train, c_test) in zip(fair, cf):
        assert c_train == pytest.approx(f_train, rel=1e-5)
        assert c_test == pytest.approx(f_test, rel=1e-5)
    # The worker pushed each layer's gradient as the backward pass produced it: on
    # ps-1 (fc3's end and fc4) the last layer's part left before fc3.bias, and on ps-0
    # fc2's before fc1's; under fair every tensor of a push leaves at once.
    for policy, layered in (("cadentflow", True), ("fair", False)):
        sent: dict[tuple[str, str], dict[str, int]] = {}
        for shard in (0, 1):
            with open(tmp_path / policy / f"flows-ps-{shard}.csv", newline="") as f:
                for r in csv.DictReader(f):
                    key = (r["sender"], r["iteration"])
                    sent.setdefault(key, {})[f"{shard}:{r['layer']}"] = int(r["sent_at_ns"])
        for times in sent.values():
            if layered:
                assert times["1:fc4.weight"] < times["1:fc3.bias"]
                assert times["0:fc2.weight"] < times["0:fc1.weight"]
            else:
                assert times["1:fc4.weight"] == times["1:fc3.bias"]
