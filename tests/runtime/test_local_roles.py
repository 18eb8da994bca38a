"""The roles through the local runtime's namespaces: sharded SSP, and the MLfabric example
with its PS killed mid-job."""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tailcut import spec
from tailcut.net import naming, netns
from tailcut.runtime import local
from tests.runtime.runs import nothing_of, start_cli, wait_for_training

pytestmark = [pytest.mark.netns, pytest.mark.e2e]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _renamed(example: str, name: str, tmp_path: Path) -> Path:
    """The example under a name of ours (tests running at once must not collide)."""
    text = (EXAMPLES / example).read_text()
    original = spec.load_text(text).name
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.replace(f"name: {original}", f"name: {name}", 1))
    return path


def test_the_sharded_ssp_example_trains_through_namespaces_and_leaves_its_dissection(tmp_path):
    job = spec.load_file(_renamed("sharded-ssp.yaml", "rl-ssp", tmp_path))
    lines: list[str] = []
    result = local.run(job, tmp_path / "results", progress=lines.append)
    assert result.converged, "\n".join(lines)
    results = tmp_path / "results"
    metrics = json.loads((results / "metrics.json").read_text())
    assert (metrics["parameter_servers"], metrics["sync_mode"], metrics["staleness"]) == (
        2, "ssp", 2)
    for name in ("rpcs.csv", "rpc_latency_cdf.png", "rpc_breakdown.png",
                 "concurrent_connections.png", "hot_parameters.png", "dissection.json",
                 "rpc-server-ps-1.csv", "logs/ps-1.log"):
        assert (results / name).stat().st_size > 0, name
    summary = json.loads((results / "dissection.json").read_text())
    assert set(summary["concurrent_connections"]) == {"ps-0", "ps-1"}
    nothing_of("rl-ssp")


def test_killing_the_ps_of_the_mlfabric_example_lets_its_replica_finish_the_job(tmp_path):
    job_file = _renamed("mlfabric.yaml", "rl-mlf", tmp_path)
    results = tmp_path / "results"
    run = start_cli(job_file, results)
    pids = wait_for_training(run, "rl-mlf", "ps-0")
    deadline = time.monotonic() + 60
    while not (results / "epochs.csv").exists() or len(
            (results / "epochs.csv").read_text().splitlines()) < 2:  # one epoch done
        assert time.monotonic() < deadline and run.poll() is None, "no epoch finished"
        time.sleep(0.05)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    killed_ns = time.time_ns()
    out, err = run.communicate(timeout=180)
    assert run.returncode == 0, out + err
    assert "replica-0 took over from ps-0 at iteration" in out
    metrics = json.loads((results / "metrics.json").read_text())
    assert metrics["converged"] and metrics["finished_by"] == "replica-0"
    takeover = metrics["takeover"]
    assert takeover["iteration"] > 0  # mid-job: the primary had finished an epoch
    assert abs(takeover["time_ns"] - killed_ns) < 5e9  # noticed within seconds of the kill
    assert not netns.pids_inside(naming.pod_netns("rl-mlf", "ps-0"))
    assert (results / "rpc-server-aggregator-0.csv").stat().st_size > 0
    nothing_of("rl-mlf")
