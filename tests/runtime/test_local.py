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
from tests.runtime.runs import nothing_of, start_cli, wait_for_training

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
    # whatever the host, the run says whether it measured the network or the host
    assert metrics["fidelity"]["verdict"] in ("network-bound", "marginal", "host-bound")
    assert any(line.startswith(f"fidelity: {metrics['fidelity']['verdict']}")
               for line in lines)
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["state"] == "finished" and record["fidelity"] == metrics["fidelity"]["verdict"]
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
    assert json.loads((tmp_path / "results" / "run.json").read_text())["state"] == "failed"
    nothing_of("dies")


def test_a_killed_run_leaves_namespaces_that_tailcut_clean_removes(tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(LONG_JOB.format(name="killed"))
    run = start_cli(job_file, tmp_path / "results")
    wait_for_training(run, "killed", "worker-0")
    run.send_signal(signal.SIGKILL)
    run.communicate(timeout=10)
    assert clean.leftovers("killed"), "a kill -9 cannot tear down; clean's job is to"
    # nothing could say it ended: the record still says it was running
    assert json.loads((tmp_path / "results" / "run.json").read_text())["state"] == "running"
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
    assert json.loads((tmp_path / "results" / "run.json").read_text())["state"] == \
        "interrupted"
    nothing_of("termed")


def test_a_job_shorter_than_one_epoch_finishes_without_a_loss_plot(tmp_path):
    job = spec.load_text("kind: TrainingJob\nmetadata: {name: short}\n"
                         "spec: {replicas: {workers: 2}, training: {iterations: 5}}\n")
    lines: list[str] = []
    result = local.run(job, tmp_path, progress=lines.append)
    assert result.epochs == 0 and result.iterations == 5
    assert any("loss.png not drawn" in line for line in lines)
    assert (tmp_path / "metrics.json").exists() and not (tmp_path / "loss.png").exists()
    nothing_of("short")


def test_a_run_records_what_full_buffers_dropped_per_link_end_apart_from_random_loss(
        tmp_path):
    job = spec.load_text(
        "apiVersion: tailcut.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: shallow}\n"
        "spec: {replicas: {workers: 2}, training: {iterations: 5, timeoutS: 60},"
        " network: {accessLink: {bandwidth: 100Mbit, bufferPackets: 8}}}\n")
    local.run(job, tmp_path, progress=lambda _: None)
    network = json.loads((tmp_path / "network.json").read_text())
    drops = network["queue_drops"]
    assert set(drops["by_link_end"]) == set(network["applied"])   # every end, both ways
    assert drops["total"] == sum(drops["by_link_end"].values())
    assert network["ebpf_dropper"] == {"passed": 0, "dropped": 0}   # no loss asked for
    print(f"queue drops: {drops}")
    assert all("pfifo buffer 8 packets per class" in what
               for end, what in network["applied"].items() if "rack" in end
               and "/p" in end)
    nothing_of("shallow")


def test_every_pod_records_its_own_tcp_counters_and_the_run_sums_them(tmp_path):
    """Each role counts in its pod's namespace: over lossy access links the TCP
    segments the roles sent again show up per pod and in the job's totals."""
    job = spec.load_text("kind: TrainingJob\nmetadata: {name: tcpcount}\n"
                         "spec: {replicas: {workers: 2}, training: {iterations: 10},\n"
                         "       network: {accessLink: {bandwidth: 1Gbit, loss: 0.02}}}\n")
    lines: list[str] = []
    result = local.run(job, tmp_path, progress=lines.append)
    tcp = json.loads((tmp_path / "metrics.json").read_text())["tcp_counters"]
    print(json.dumps(tcp, indent=1))
    assert sorted(tcp["pods"]) == ["ps-0", "worker-0", "worker-1"] and tcp["missing"] == []
    assert all(c["out_segs"] > 100 for c in tcp["pods"].values())   # each its own traffic
    assert tcp["total"]["retrans_segs"] == sum(c["retrans_segs"] for c in tcp["pods"].values())
    assert result.tcp_retrans_segs == tcp["total"]["retrans_segs"] > 0
    assert result.tcp_rto_timeouts == tcp["total"]["rto_timeouts"]
    rows = (tmp_path / "tcp_counters.csv").read_text().splitlines()
    assert rows[0].startswith("pod,out_segs,retrans_segs,rto_timeouts") and len(rows) == 4
    assert any(line.startswith("tcp (3 pods' namespaces): ") for line in lines)
    nothing_of("tcpcount")


def test_every_role_records_the_cpu_its_threads_used_while_training(tmp_path):
    """A bounded-loss job's roles charge their transport threads (send, receive,
    control) apart from the main one, per pod and summed, with the datagram code they
    ran, and the run says so."""
    # 100 iterations: a worker's send thread then spends several of the kernel's 10 ms
    # CPU ticks (30 took about one, and read 0 once the racks' bridges skipped netfilter)
    job = spec.load_text("kind: TrainingJob\nmetadata: {name: cpucount}\n"
                         "spec: {replicas: {workers: 2}, training: {iterations: 100},\n"
                         "       transport: {type: bounded-loss, p: 0.9}}\n")
    lines: list[str] = []
    local.run(job, tmp_path, progress=lines.append)
    cpu = json.loads((tmp_path / "metrics.json").read_text())["cpu"]
    print(json.dumps(cpu, indent=1))
    assert sorted(cpu["pods"]) == ["ps-0", "worker-0", "worker-1"] and cpu["missing"] == []
    for pod, usage in cpu["pods"].items():
        kinds = usage["kinds"]
        assert sum(kinds["main (model, protocol)"].values()) > 0, pod
        assert sum(kinds["datagram send"].values()) > 0, pod   # workers push, the PS pulls
        assert sum(kinds["datagram receive"].values()) > 0, pod
    assert cpu["total_s"] == pytest.approx(
        sum(u["user_s"] + u["system_s"] for u in cpu["pods"].values()), abs=0.01)
    assert cpu["cores"] >= 1 and cpu["busy"] > 0
    # and which code the datagram threads ran: the compiled paths, after the README's set-up
    assert cpu["datagram_paths"] == {"compiled": ["ps-0", "worker-0", "worker-1"]}
    assert any(line.startswith("cpu: the roles used ") and
               line.endswith("; datagram paths: compiled") for line in lines)
    assert "datagram send and receive paths: compiled" in lines
    nothing_of("cpucount")
