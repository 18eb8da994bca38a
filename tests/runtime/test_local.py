"""Whole runs of the local runtime: success, a failing run, and a killed run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tailcut import spec
from tailcut.net import clean, netns, naming
from tailcut.runtime import local

pytestmark = [pytest.mark.netns, pytest.mark.e2e]

LONG_JOB = """\
apiVersion: tailcut.dev/v1alpha1
kind: TrainingJob
metadata: {{name: {name}}}
spec:
  replicas: {{workers: 2}}
  training: {{epochs: 1000, timeoutS: 120}}
  network:
    racks: [{{name: a}}, {{name: b}}]
    accessLink: {{bandwidth: 1Gbit, loss: 0.01}}
"""


def nothing_of(job: str) -> None:
    """Assert the host holds no namespace, link, process or BPF program of `job`."""
    assert clean.leftovers(job) == []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert naming.alias(job) not in links
    deadline = time.monotonic() + 5  # BPF programs are freed after an RCU grace period
    while "tailcut_drop" in _bpf_programs() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "tailcut_drop" not in _bpf_programs()


def _bpf_programs() -> str:
    return subprocess.run(["bpftool", "prog", "show"], capture_output=True, text=True).stdout


def start_cli(job_file: Path, results: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tailcut.cli", "run", str(job_file),
                             "--results-dir", str(results)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_training(run: subprocess.Popen, job: str, pod: str,
                      timeout_s: float = 30) -> list[int]:
    """Wait until pod `pod` of `job` has a process in it; return the pids. The
    runner itself may be inside for a moment while it builds: never count it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if run.poll() is not None:
            raise AssertionError(f"the run ended early: {run.communicate()}")
        pids = [p for p in netns.pids_inside(naming.pod_netns(job, pod)) if p != run.pid]
        if pids:
            time.sleep(1.0)  # let it get past start-up into training
            return pids
        time.sleep(0.1)
    raise AssertionError(f"{pod} of {job} never started")


def test_the_quickstart_reaches_its_target_within_3_minutes_and_writes_results(tmp_path):
    job = spec.load_file("examples/quickstart.yaml")
    lines: list[str] = []
    result = local.run(job, tmp_path, progress=lines.append)
    print("\n".join(lines))
    assert result.converged
    assert result.final_accuracy >= job.spec.training.target_accuracy
    assert result.jct_s < 180
    assert any(line.startswith("epoch") for line in lines)
    for name in ("spec.yaml", "topology.json", "network.json", "metrics.json",
                 "epochs.csv", "loss.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["converged"] and metrics["transport"] == "tcp"
    assert spec.load_file(tmp_path / "spec.yaml") == job
    nothing_of("quickstart")


def test_a_run_whose_worker_dies_fails_clearly_and_leaves_nothing(tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(LONG_JOB.format(name="dies"))
    run = start_cli(job_file, tmp_path / "results")
    for pid in wait_for_training(run, "dies", "worker-1"):
        os.kill(pid, signal.SIGKILL)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 1, out + err
    assert "worker-1 exited with code -9 (killed by SIGKILL)" in err
    nothing_of("dies")


def test_a_killed_run_leaves_namespaces_that_tailcut_clean_removes(tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(LONG_JOB.format(name="killed"))
    run = start_cli(job_file, tmp_path / "results")
    wait_for_training(run, "killed", "worker-0")
    run.send_signal(signal.SIGKILL)
    run.communicate(timeout=10)
    assert clean.leftovers("killed"), "a kill -9 cannot tear down; clean's job is to"
    deadline = time.monotonic() + 5  # the roles die with the runner (PR_SET_PDEATHSIG)
    while any(netns.pids_inside(n) for n in clean.leftovers("killed")):
        assert time.monotonic() < deadline, "training processes outlived the runner"
        time.sleep(0.1)
    cleaned = subprocess.run([sys.executable, "-m", "tailcut.cli", "clean", "killed"],
                             capture_output=True, text=True)
    assert cleaned.returncode == 0 and "6 namespace(s) removed" in cleaned.stdout
    assert "removed tailcut-killed.ps-0" in cleaned.stdout
    nothing_of("killed")


def test_sigterm_tears_the_network_down(tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(LONG_JOB.format(name="termed"))
    run = start_cli(job_file, tmp_path / "results")
    wait_for_training(run, "termed", "ps-0")
    run.send_signal(signal.SIGTERM)
    run.communicate(timeout=30)
    assert run.returncode != 0
    nothing_of("termed")
