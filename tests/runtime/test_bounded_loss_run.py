"""A training run over the bounded-loss transport on lossy links: every message keeps
at least p, the XDP counters are detached, and nothing is left behind."""

import csv
import json
import subprocess

import pytest

from tailcut import spec
from tailcut.runtime import local
from tailcut.transports import datagram
from tests.runtime.test_local import nothing_of

pytestmark = [pytest.mark.netns, pytest.mark.bpf, pytest.mark.e2e]

JOB = """\
apiVersion: tailcut.dev/v1alpha1
kind: TrainingJob
metadata: {name: bl-e2e}
spec:
  replicas: {workers: 2}
  training: {batchSize: 250, iterations: 32, epochs: 1000, timeoutS: 120}
  network:
    accessLink: {bandwidth: 1Gbit, loss: 0.05}
  transport: {type: bounded-loss, p: 0.9}
"""


def test_a_bounded_loss_run_keeps_p_of_every_message_and_leaves_nothing(tmp_path) -> None:
    job = spec.load_text(JOB)
    result = local.run(job, tmp_path, progress=lambda line: None)
    assert result.iterations == 32
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["transport"] == "bounded-loss"
    rows = list(csv.DictReader(open(tmp_path / "messages.csv")))
    rows += [r for i in range(2)
             for r in csv.DictReader(open(tmp_path / f"messages-worker-{i}.csv"))]
    data = [r for r in rows if r["kind"] in ("PUSH", "PARAMS")]
    assert len(data) == 2 * 32 * 2
    total = 64714  # the MLP's parameters
    allowed = total - datagram.threshold_elements(0.9, total)
    assert max(int(r["missing"]) for r in data) <= allowed
    assert any(int(r["missing"]) > 0 for r in data)  # it did use its slack
    nothing_of("bl-e2e")
    progs = subprocess.run(["bpftool", "prog", "show"], capture_output=True, text=True).stdout
    assert "tailcut_partial" not in progs or "bl-e2e" not in progs
