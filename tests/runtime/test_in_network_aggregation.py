"""In-network aggregation under `tailcut run`: each workers' rack's ToR sums its four
workers' gradients in BPF and sends the PS one sum; the model is the one the PS alone
trains (the same seed, only the Q8.24 rounding differs), the PS's link receives about a
quarter of the bytes, and with loss on the access links the PS flushes the short slots
and counts the contributions that never arrived. Nothing of it stays behind."""

import csv
import json
from pathlib import Path

import pytest

from tailcut.runtime import local
from tests.runtime.runs import SPARSE_ITERATIONS as ITERATIONS, nothing_of, sparse_job

pytestmark = [pytest.mark.netns, pytest.mark.bpf, pytest.mark.e2e]

SLOTS = -(-92113 // 360)   # the sparse model's gradient in 360-value slots


def _job(name: str, loss: float = 0.0):
    return sparse_job("in-network-aggregation.yaml", name, {"aggregate": True}, loss)


def _per_iteration(results: Path) -> list[dict[str, str]]:
    with open(results / "agg-ps-0.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_the_racks_sum_the_gradients_and_the_model_is_the_same(tmp_path, sparse_ps_alone):
    lines: list[str] = []
    summed = local.run(_job("innet-agg"), tmp_path / "tor", progress=lines.append)
    alone, alone_results = sparse_ps_alone
    assert summed.iterations == alone.iterations == ITERATIONS
    assert summed.final_loss == pytest.approx(alone.final_loss, rel=1e-3, abs=1e-4)
    assert summed.final_accuracy == pytest.approx(alone.final_accuracy, abs=0.005)

    network = json.loads((tmp_path / "tor" / "network.json").read_text())
    for rack in ("rack-1", "rack-2"):
        packets = network["aggregation"][rack]["packets"]
        # per slot and iteration: three members' ADDs end at the ToR, the fourth's goes
        # on; a sum still on its way when the PS looked is flushed too, and is whole
        assert packets["added"] == 3 * SLOTS * ITERATIONS
        assert packets["forwarded"] == SLOTS * ITERATIONS
        assert set(packets) <= {"added", "forwarded", "flushed"}, packets
    rows = _per_iteration(tmp_path / "tor")
    assert [int(r["iteration"]) for r in rows] == list(range(ITERATIONS))
    assert all(r["missing_contributions"] == "0" for r in rows)
    received = {variant: json.loads((results / "network.json").read_text())
                ["pod_links"]["ps-0"]["rx_bytes"]
                for variant, results in (("tor", tmp_path / "tor"), ("ps", alone_results))}
    assert received["tor"] < 0.3 * received["ps"]   # two sums instead of eight gradients
    assert any("ToR aggregation: racks [1, 2]" in line for line in lines)
    nothing_of("innet-agg")


def test_with_loss_the_short_slots_are_flushed_and_counted(tmp_path):
    result = local.run(_job("innet-agg-loss", loss=0.02), tmp_path,
                       progress=lambda line: None)
    assert result.iterations == ITERATIONS
    rows = _per_iteration(tmp_path)
    flushed = sum(int(r["flushed_slots"]) for r in rows)
    missing = sum(int(r["missing_contributions"]) for r in rows)
    assert flushed > 0 and missing > 0
    network = json.loads((tmp_path / "network.json").read_text())
    packets = {k: sum(network["aggregation"][r]["packets"].get(k, 0)
                      for r in ("rack-1", "rack-2"))
               for k in ("added", "forwarded", "flushed")}
    # every ADD is in a sum the PS took (added at a ToR, or the last and forwarded) or
    # counted missing there (lost on the way, or late for a flushed iteration)
    assert packets["added"] + packets["forwarded"] + missing == 8 * SLOTS * ITERATIONS
    assert packets["flushed"] >= flushed
    assert result.final_accuracy > 0.5
    nothing_of("innet-agg-loss")
