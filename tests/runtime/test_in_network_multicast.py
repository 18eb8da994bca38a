"""The parameters multicast at the ToR under `tailcut run`, alone and with in-network
aggregation: the PS sends each workers' rack one copy of the model and its ToR copies
it to the rack's four workers; the model is the one the PS alone trains (multicast
carries float32 exactly), the PS's link sends about a quarter of the bytes, and with
loss on the access links every lost copy is repaired. Nothing of it stays behind."""

import csv
import json
from pathlib import Path

import pytest

from tailcut.runtime import local
from tests.runtime.runs import SPARSE_ITERATIONS as ITERATIONS, nothing_of, sparse_job

pytestmark = [pytest.mark.netns, pytest.mark.bpf, pytest.mark.e2e]

SLOTS = -(-92113 // 360)   # the sparse model in 360-value slots


def _job(name: str, in_network: dict, loss: float = 0.0):
    return sparse_job("in-network-whole-iteration.yaml", name, in_network, loss)


def _repaired(results: Path) -> int:
    total = 0
    for w in range(8):
        with open(results / f"mcast-worker-{w}.csv", newline="") as f:
            total += sum(int(r["repaired_slots"]) for r in csv.DictReader(f))
    return total


def test_the_racks_copy_the_model_and_it_trains_as_the_ps_alone(tmp_path, sparse_ps_alone):
    lines: list[str] = []
    copied = local.run(_job("innet-mcast", {"multicast": True}), tmp_path / "mcast",
                       progress=lines.append)
    alone, alone_results = sparse_ps_alone
    assert copied.iterations == alone.iterations == ITERATIONS
    assert copied.final_loss == alone.final_loss   # float32 copies: the same numbers
    network = json.loads((tmp_path / "mcast" / "network.json").read_text())
    for rack in ("rack-1", "rack-2"):
        got = network["multicast"][rack]
        assert got["packets"] == {"replicated": SLOTS * ITERATIONS}
        assert got["copies"] == {f"p{slot}": SLOTS * ITERATIONS for slot in range(4)}
    sent = {v: json.loads((results / "network.json").read_text())
            ["pod_links"]["ps-0"]["tx_bytes"]
            for v, results in (("mcast", tmp_path / "mcast"), ("ps", alone_results))}
    assert sent["mcast"] < 0.3 * sent["ps"]   # two copies instead of eight
    assert _repaired(tmp_path / "mcast") == 0
    assert any("ToR multicast: racks [1, 2]" in line for line in lines)
    nothing_of("innet-mcast")


def test_with_aggregation_and_loss_every_lost_copy_is_repaired(tmp_path):
    result = local.run(_job("innet-whole", {"multicast": True, "aggregate": True},
                            loss=0.02), tmp_path, progress=lambda line: None)
    assert result.iterations == ITERATIONS
    assert _repaired(tmp_path) > 0
    network = json.loads((tmp_path / "network.json").read_text())
    assert set(network) >= {"multicast", "aggregation"}
    assert result.final_accuracy > 0.5
    nothing_of("innet-whole")


def test_hot_parameters_aggregation_and_multicast_together_train_as_the_ps_alone(
        tmp_path, sparse_ps_alone):
    every = {"hotParameters": {"topK": 9216}, "aggregate": True, "multicast": True}
    together = local.run(_job("innet-every", every), tmp_path / "every",
                         progress=lambda line: None)
    alone, _ = sparse_ps_alone
    assert together.iterations == alone.iterations == ITERATIONS
    # Q8.24 sums and hot updates: the same model to the fixed point's rounding
    assert together.final_loss == pytest.approx(alone.final_loss, rel=1e-3, abs=1e-4)
    network = json.loads((tmp_path / "every" / "network.json").read_text())
    assert set(network) >= {"hot_store", "aggregation", "multicast"}
    assert network["hot_store"]["iterations"] == [ITERATIONS]
    nothing_of("innet-every")
