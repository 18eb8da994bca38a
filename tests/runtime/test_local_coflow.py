"""Whole runs with scheduling.policy coflow: every flow of a coflow paced to end together."""

import json
from pathlib import Path

import pytest

from tailcut import spec
from tailcut.runtime import local
from tests.runtime.runs import nothing_of

pytestmark = [pytest.mark.netns, pytest.mark.e2e]

# worker-1 sits behind a 100 Mbit/s rack uplink, worker-0 next to the PS on 500 Mbit/s
# access links: the uplink is the pull coflow's bottleneck. MADD slows worker-0's
# flow to end with worker-1's; TCP fair share lets worker-0's finish ~4x sooner.
JOB = """\
apiVersion: tailcut.dev/v1alpha1
kind: TrainingJob
metadata: {{name: {name}}}
spec:
  replicas: {{workers: 2}}
  training: {{model: deep-mlp, batchSize: 64, learningRate: 0.1, epochs: 1,
             targetAccuracy: null, iterations: 20, timeoutS: 120}}
  network:
    racks: [{{name: a}}, {{name: b}}]
    placement: {{ps-0: a, worker-0: a, worker-1: b}}
    accessLink: {{bandwidth: 500Mbit}}
    uplink: {{bandwidth: 100Mbit}}
  scheduling: {{policy: {policy}}}
"""


def _pull_fct(results: Path) -> dict[str, float]:
    summary = json.loads((results / "metrics.json").read_text())["scheduling"]
    return {pair: s["median"] for pair, s in summary["flow_fct_s"]["pull"].items()}


def test_a_coflow_run_paces_the_near_worker_to_finish_with_the_far_one(tmp_path):
    job = spec.load_text(JOB.format(name="cof-run", policy="coflow"))
    result = local.run(job, tmp_path / "coflow", progress=lambda _: None)
    nothing_of("cof-run")
    assert result.iterations == 20
    fair = local.run(spec.load_text(JOB.format(name="cof-fair", policy="fair")),
                     tmp_path / "fair", progress=lambda _: None)
    nothing_of("cof-fair")
    config = json.loads((tmp_path / "coflow" / "logs" / "ps-0.json").read_text())
    pace = config["flows"]["pace"]["ps-0"]
    assert pace["worker-0"] == pytest.approx(pace["worker-1"])  # equal sizes, equal rates
    coflow_fct, fair_fct = _pull_fct(tmp_path / "coflow"), _pull_fct(tmp_path / "fair")
    near, far = "-1->worker-0", "-1->worker-1"
    # Measured in the runs: under coflow the near flow ends with the far one ...
    assert coflow_fct[near] > 0.8 * coflow_fct[far], coflow_fct
    # ... under fair share it is done long before.
    assert fair_fct[near] < 0.5 * fair_fct[far], fair_fct
    metrics = json.loads((tmp_path / "coflow" / "metrics.json").read_text())["scheduling"]
    assert metrics["policy"] == "coflow"
    assert metrics["coflow_spread_s"]["pull"]["median"] < 0.2 * coflow_fct[far]
    assert (tmp_path / "coflow" / "flows.json").exists()
