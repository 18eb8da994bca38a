"""syncMode allreduce through the local runtime: DDP/Gloo ranks in their pods' namespaces,
over the job's shaped links, leaving the same results directory as a PS job."""

import json

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
