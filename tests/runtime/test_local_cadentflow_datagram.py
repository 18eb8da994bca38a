"""A whole run with transport bounded-loss and scheduling.policy cadentflow: it trains,
every tensor is its own tagged flow with its own completion time, nothing is left."""

import csv
import json

import pytest

from tailcut import spec
from tailcut.runtime import local
from tailcut.transports import datagram
from tests.runtime.runs import nothing_of

pytestmark = [pytest.mark.netns, pytest.mark.bpf, pytest.mark.e2e]

JOB = """\
apiVersion: tailcut.dev/v1alpha1
kind: TrainingJob
metadata: {name: dg-cf}
spec:
  replicas: {workers: 2}
  training: {model: deep-mlp, batchSize: 64, learningRate: 0.1, epochs: 1000,
             iterations: 15, timeoutS: 120}
  network:
    racks: [{name: a}]
    accessLink: {bandwidth: 200Mbit}
  transport: {type: bounded-loss, p: 0.9}
  scheduling: {policy: cadentflow}
"""
LAYERS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias",
          "fc4.weight", "fc4.bias")


def test_a_bounded_loss_cadentflow_run_trains_and_times_every_tensor(tmp_path) -> None:
    result = local.run(spec.load_text(JOB), tmp_path, progress=lambda _: None)
    assert result.iterations == 15
    assert result.final_accuracy > 0.2, result  # 10 classes: chance is 0.1
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["transport"] == "bounded-loss"
    summary = json.loads((tmp_path / "flows.json").read_text())
    assert summary["policy"] == "cadentflow"
    for direction in ("pull", "push"):
        fct = summary["fct_s"][direction]
        assert list(fct) == list(LAYERS)
        assert [fct[name]["level"] for name in LAYERS] == [0, 0, 1, 1, 2, 2, 3, 3]
        # Parts are timed one by one: the urgent tensor is done well before the big one.
        assert fct["fc1.weight"]["median"] < fct["fc3.weight"]["median"], fct
    rows = list(csv.DictReader(open(tmp_path / "flows-worker-0.csv")))
    assert {r["layer"] for r in rows} == set(LAYERS) and len(rows) == 15 * len(LAYERS)
    # Each message still keeps p of its elements (the padding of the wire layout is
    # not counted as data).
    messages = [r for r in csv.DictReader(open(tmp_path / "messages-worker-0.csv"))
                if r["kind"] == "PARAMS"]
    total = 316_714
    assert max(int(r["missing"]) for r in messages) <= \
        total - datagram.threshold_elements(0.9, total)
    # Every packet left with its cut's DSCP: on the PS's egress fc3.weight's level 2
    # carries most bytes (83% of the model). DONE comes at p = 0.9 of the whole
    # message, inside fc3.weight, so level 3 (fc4, 16 packets a message) is mostly
    # never sent: what p leaves out falls on the least urgent tensor.
    network = json.loads((tmp_path / "network.json").read_text())
    counts = network["scheduling"]["classified"]["tailcut-dg-cf.ps-0/eth0"]
    tagged = sum(counts[str(level)][1] for level in range(4))
    assert counts["2"][1] > 0.7 * tagged, counts
    assert all(counts[str(level)][0] > 0 for level in range(3)), counts
    assert counts["3"][0] < 0.5 * 16 * len(messages) * 2, counts  # both workers' PARAMS
    nothing_of("dg-cf")
