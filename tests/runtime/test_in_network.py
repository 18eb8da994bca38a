"""The ToR's hot-parameter store under `tailcut run`: the sparse model with its hot
parameters in a BPF program on the PS's rack trains to the same model as without it
(fixed point changes only the last digits), the ToR applies most of the updates, and
nothing of it stays behind."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from tailcut import spec
from tailcut.runtime import local
from tests.runtime.runs import nothing_of

pytestmark = [pytest.mark.netns, pytest.mark.bpf, pytest.mark.e2e]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "in-network.yaml"
ITERATIONS = 60


def _job(name: str, with_store: bool) -> spec.model.TrainingJob:
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["metadata"]["name"] = name
    raw["spec"]["training"].pop("targetAccuracy")
    raw["spec"]["training"]["iterations"] = ITERATIONS
    if not with_store:
        del raw["spec"]["network"]["inNetwork"]
    return spec.from_dict(raw)


def test_the_store_serves_the_hot_parameters_and_the_model_is_the_same(tmp_path):
    lines: list[str] = []
    with_store = local.run(_job("innet-tor", True), tmp_path / "tor", progress=lines.append)
    without = local.run(_job("innet-ps", False), tmp_path / "ps", progress=lines.append)
    assert with_store.iterations == without.iterations == ITERATIONS
    # BSP with the same seed is deterministic; only the Q8.24 rounding differs.
    assert with_store.final_loss == pytest.approx(without.final_loss, rel=1e-3, abs=1e-4)
    assert with_store.final_accuracy == pytest.approx(without.final_accuracy, abs=0.005)

    results = tmp_path / "tor"
    store = json.loads((results / "network.json").read_text())["hot_store"]
    slots = -(-9216 // 360)
    assert store["packets"]["pushed"] == 8 * slots * ITERATIONS
    assert store["packets"]["pulled"] >= 8 * slots * ITERATIONS
    unexpected = set(store["packets"]) - {"pulled", "pushed", "counted", "not_ready",
                                          "duplicate", "stale"}
    assert not unexpected, store
    assert store["iterations"] == [ITERATIONS]
    with np.load(results / "updates-tor.npz") as z:
        assert len(z["index"]) == 9216 and z["counts"].sum() > 0
    dissection = json.loads((results / "dissection.json").read_text())
    assert dissection["hot_parameters"]["served_by_tor"] > 0.5
    assert (results / "hot-worker-0.csv").read_text().count("push") == ITERATIONS
    assert any("ToR hot-parameter store: 9216 parameters at 10.1.0.254" in line
               for line in lines)
    nothing_of("innet-tor")
    nothing_of("innet-ps")
