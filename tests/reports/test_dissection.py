"""Tests of the IMC'20 dissection report: top-k shares and the PNGs of a real loopback job."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tailcut.reports import dissection
from tests.training import loopback


def test_top_k_share_is_the_fraction_of_updates_the_k_hottest_parameters_took() -> None:
    counts = np.array([0, 50, 10, 30, 10], dtype=np.int64)
    assert dissection.top_k_shares(counts, ks=(1, 2, 5, 10)) == {1: 0.5, 2: 0.8, 5: 1.0}


def test_a_directory_without_rpc_logs_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no RPCs to dissect"):
        dissection.report(tmp_path)


def test_a_two_shard_job_gets_all_four_figures_and_the_numbers_behind_them(
    tmp_path: Path,
) -> None:
    job = loopback.Job(tmp_path, num_workers=2, shards=2,
                       options={"max_iterations": 20, "target_accuracy": None})
    job.run()
    written = dissection.report(job.results, title="rl-report")
    names = {p.name for p in written}
    for png in ("rpc_latency_cdf.png", "rpc_breakdown.png", "concurrent_connections.png",
                "hot_parameters.png"):
        assert png in names and (job.results / png).read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((job.results / "dissection.json").read_text())
    # ps-0's STOP may reach ps-1 before a worker's last push does (that push goes
    # unanswered), or after ps-1 already answered a pull for step 20
    assert 2 * 2 * 20 - 2 <= summary["rpcs"]["push"] <= 2 * 2 * 20
    assert 2 * 2 * 20 <= summary["rpcs"]["pull"] <= 2 * 2 * 20 + 2
    assert set(summary["concurrent_connections"]) == {"ps-0", "ps-1"}
    assert 1 <= summary["concurrent_connections"]["ps-0"]["max"] <= 2  # two workers
    hot = summary["hot_parameters"]
    assert hot["num_params"] == 64714
    # update counting is model-agnostic: a parameter counts when its update is non-zero;
    # 2 workers x 20 iterations is 40 pushes, so no parameter has more than 40
    counts = dissection.update_counts(job.results)
    assert counts.max() <= 40 and counts.sum() == hot["updates"]
    assert hot["top_k_share"]["1"] == pytest.approx(counts.max() / counts.sum())
