"""Whole runs with scheduling.policy cadentflow: trains, orders tensors, cleans up."""

import json
import os
import signal
import statistics
from pathlib import Path

import pytest

from tailcut import spec
from tailcut.runtime import local
from tests.runtime.runs import nothing_of, start_cli, wait_for_training

pytestmark = [pytest.mark.netns, pytest.mark.bpf, pytest.mark.e2e]

JOB = """\
apiVersion: tailcut.dev/v1alpha1
kind: TrainingJob
metadata: {{name: {name}}}
spec:
  replicas: {{workers: 2}}
  training: {{model: deep-mlp, batchSize: 64, learningRate: 0.1, epochs: {epochs},
             targetAccuracy: {target}, iterations: {iterations}, timeoutS: 120}}
  network:
    racks: [{{name: a}}]
    accessLink: {{bandwidth: 500Mbit}}
  scheduling: {{policy: {policy}}}
"""


def _job(name: str, policy: str, epochs: int = 10, target: object = 0.9,
         iterations: object = "null") -> spec.TrainingJob:
    return spec.load_text(JOB.format(name=name, policy=policy, epochs=epochs, target=target,
                                     iterations=iterations))


def _pull_fct(results: Path, layer: str) -> float:
    summary = json.loads((results / "metrics.json").read_text())["scheduling"]
    return summary["fct_s"]["pull"][layer]["median"]


def test_a_cadentflow_run_trains_to_target_and_its_first_layer_arrives_before_fairs(tmp_path):
    cf = local.run(_job("cf2-cf", "cadentflow"), tmp_path / "cf", progress=lambda _: None)
    assert cf.converged and cf.final_accuracy >= 0.9
    nothing_of("cf2-cf")
    fair = local.run(_job("cf2-fair", "fair", epochs=1, target="null", iterations=63),
                     tmp_path / "fair", progress=lambda _: None)
    nothing_of("cf2-fair")
    metrics = json.loads((tmp_path / "cf" / "metrics.json").read_text())["scheduling"]
    assert metrics["policy"] == "cadentflow" and metrics["iteration_s"] > 0
    pull = metrics["fct_s"]["pull"]
    assert pull["fc1.weight"]["level"] == 0 and pull["fc4.bias"]["level"] == 3
    # Measured in the runs: the most urgent tensor's PARAMS part is complete well
    # before the whole untagged message is under fair (which delivers every tensor
    # at once, at its end).
    cf_first = _pull_fct(tmp_path / "cf", "fc1.weight")
    fair_first = _pull_fct(tmp_path / "fair", "fc1.weight")
    assert cf_first < 0.5 * fair_first, (cf_first, fair_first)
    assert cf_first < _pull_fct(tmp_path / "cf", "fc3.weight")
    # Every part left with its own DSCP: on the PS's egress (PARAMS) fc3.weight's level
    # 2 carries most bytes, as fc3.weight is 83% of the model.
    network = json.loads((tmp_path / "cf" / "network.json").read_text())
    counts = network["scheduling"]["classified"]["tailcut-cf2-cf.ps-0/eth0"]
    tagged = sum(counts[str(level)][1] for level in range(4))
    assert counts["2"][1] > 0.7 * tagged, counts
    assert json.loads((tmp_path / "fair" / "network.json").read_text())[
        "scheduling"]["classes"] == {}


def test_a_killed_cadentflow_run_leaves_no_classifier_behind(tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(JOB.format(name="cf2-kill", policy="cadentflow", epochs=1000,
                                   target="null", iterations="null"))
    run = start_cli(job_file, tmp_path / "results")
    wait_for_training(run, "cf2-kill", "worker-0")
    os.kill(run.pid, signal.SIGTERM)
    run.communicate(timeout=60)
    nothing_of("cf2-kill")


def test_a_failed_cadentflow_run_leaves_no_classifier_behind(tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(JOB.format(name="cf2-dies", policy="cadentflow", epochs=1000,
                                   target="null", iterations="null"))
    run = start_cli(job_file, tmp_path / "results")
    for pid in wait_for_training(run, "cf2-dies", "worker-1"):
        os.kill(pid, signal.SIGKILL)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 1, out + err
    assert "worker-1 exited with code -9" in err
    nothing_of("cf2-dies")
