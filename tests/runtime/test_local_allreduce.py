"""syncMode allreduce through the local runtime: DDP/Gloo ranks (tcp) or the transpose
all-reduce (bounded-loss) in their pods' namespaces, over the job's shaped links,
leaving the same results directory as a PS job."""

import csv
import json
import subprocess

import pytest

from tailcut import spec
from tailcut.ml import torchmodel
from tailcut.runtime import local
from tests.runtime.runs import nothing_of

pytestmark = [pytest.mark.netns, pytest.mark.e2e,
              pytest.mark.skipif(not torchmodel.available(),
                                 reason="PyTorch is not installed (scripts/setup.sh)")]


def test_the_allreduce_example_trains_over_the_jobs_links_and_writes_its_results(tmp_path):
    raw = spec.load_file("examples/allreduce-gloo.yaml").model_dump(by_alias=True, mode="json")
    raw["metadata"]["name"] = "ar-e2e"
    raw["spec"]["training"].update(epochs=2, targetAccuracy=None)
    job = spec.from_dict(raw)
    assert job.spec.pod_names() == ["worker-0", "worker-1", "worker-2", "worker-3"]
    lines: list[str] = []
    result = local.run(job, tmp_path, progress=lines.append)
    print("\n".join(lines))
    assert result.epochs == 2 and result.iterations == 2 * 63
    assert result.final_accuracy > 0.5
    for name in ("spec.yaml", "epochs.csv", "loss.png", "metrics.json", "allreduce.json",
                 "allreduce.png", "allreduce-worker-3.csv"):
        assert (tmp_path / name).stat().st_size > 0, name
    summary = json.loads((tmp_path / "allreduce.json").read_text())
    assert summary["iterations"] == 126 and summary["allreduce_ms"]["p50"] > 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["sync_mode"] == "allreduce" and metrics["finished_by"] == "worker-0"
    # Gloo's ring crossed the pods' shaped links (rack-0 to rack-1 over the uplinks):
    # rank 0 bound its pod's eth0, and the pods' kernels counted the segments.
    start = json.loads((tmp_path / "logs" / "worker-0.json").read_text())
    assert start["ps_host"].startswith("10.1.0.")
    assert metrics["tcp_counters"]["total"]["out_segs"] > 1000
    nothing_of("ar-e2e")


@pytest.mark.bpf
def test_allreduce_over_bounded_loss_runs_the_transpose_through_the_xdp_counter(tmp_path):
    raw = spec.load_file("examples/allreduce-bounded-loss.yaml").model_dump(
        by_alias=True, mode="json")
    raw["metadata"]["name"] = "arbl-e2e"
    raw["spec"]["training"].update(epochs=1, targetAccuracy=None)
    raw["spec"]["network"]["accessLink"]["loss"] = 0.01
    job = spec.from_dict(raw)
    result = local.run(job, tmp_path, progress=lambda line: None)
    assert result.epochs == 1 and result.iterations == 63 and result.final_accuracy > 0.4
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["sync_mode"] == "allreduce" and metrics["transport"] == "bounded-loss"
    summary = json.loads((tmp_path / "allreduce.json").read_text())
    assert summary["iterations"] == 63
    # Two racks of two (training.relay): each rank took 4 messages per iteration, its
    # rack peer's gradient pieces and parameters (2 shards each), its relay's sum and
    # its relayed shard's parameters (1 shard each); at least p of each, the rest
    # repaired (NACK) or left out.
    rows = [r for i in range(4)
            for r in csv.DictReader(open(tmp_path / f"messages-worker-{i}.csv"))]
    assert len(rows) == 4 * 4 * 63
    shards = 2 * (64714 // 4 + 1)   # the most a message holds
    assert max(int(r["missing"]) for r in rows) <= shards - int(0.9 * shards) + 1
    logs = (tmp_path / "logs" / "worker-2.log").read_text()
    assert "XDP counter attached" in logs
    nothing_of("arbl-e2e")
    progs = subprocess.run(["bpftool", "prog", "show"], capture_output=True, text=True).stdout
    assert "arbl" not in progs
