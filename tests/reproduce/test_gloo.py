"""apnet19's section "against Gloo": its jobs, and its table read from files written here
by hand (no job runs)."""

import json
from pathlib import Path

import pytest
import yaml

from tailcut import spec
from tailcut.ml import torchmodel
from tailcut.reproduce import apnet19, gloo
from tailcut.reproduce.measure import Files, Measured

pytestmark = pytest.mark.skipif(not torchmodel.available(),
                                reason="PyTorch is not installed (scripts/setup.sh)")


def test_the_gloo_steps_set_ddp_beside_bounded_loss_by_ps_and_all_reduce():
    plan = {s.name: spec.from_dict(yaml.safe_load(s.job)) for s in apnet19.steps(False)
            if s.name.startswith("gloo-")}
    assert list(plan) == [f"gloo-{c}-{m}-r{r}" for c in ("clean", "tail") for r in (1, 2, 3)
                          for m in ("gloo", "ps-bl", "ar-bl")]
    for name, job in plan.items():
        assert job.spec.training.model == "torch-mlp", name
        assert job.spec.network.access_link.loss == (0.01 if "-tail-" in name else 0.0)
    ddp, ps = plan["gloo-tail-gloo-r2"], plan["gloo-tail-ps-bl-r2"]
    assert ddp.spec.training.sync_mode == "allreduce" and "ps-0" not in ddp.spec.pod_names()
    assert ps.spec.training.sync_mode == "bsp" and ps.spec.transport.p == 0.9
    ar = plan["gloo-tail-ar-bl-r2"]
    assert ar.spec.training.sync_mode == "allreduce" and ar.spec.transport.p == 0.9
    assert "ps-0" not in ar.spec.pod_names()


def _write_run(paper_dir: Path, name: str, mode: str, reached_s: float, steps_ms: list[float]):
    results = paper_dir / "steps" / name / "results"
    results.mkdir(parents=True)
    (results / "metrics.json").write_text(json.dumps({"jct_s": reached_s + 1,
                                                       "final_accuracy": 0.931}))
    (results / "epochs.csv").write_text(
        "epoch,iteration,train_loss,test_loss,test_accuracy,elapsed_s\n"
        f"1,63,1,1,0.5,{reached_s / 2}\n2,126,1,1,0.931,{reached_s}\n")
    for w in range(4):
        if mode != "ps-bl":
            rows = "".join(f"{i},1,1,{ms},1\n" for i, ms in enumerate(steps_ms))
            (results / f"allreduce-worker-{w}.csv").write_text(
                "step,compute_ms,allreduce_ms,iteration_ms,buckets\n" + rows)
        else:
            done, rows = 0, ""
            for i, ms in enumerate([0.0, *steps_ms]):
                done += int(ms * 1e6)
                rows += f"pull,worker-{w},ps-0,{i},0,0,0,0,{done},0\n"
            (results / f"rpc-client-worker-{w}.csv").write_text(
                "op,client,server,step,sent_ns,request_bytes,reply_arrived_ns,dequeued_ns,"
                "done_ns,reply_bytes\n" + rows)


def test_the_table_sets_gloos_time_to_target_beside_bounded_losss_with_both_tails(tmp_path):
    steady, spiky = [10.0] * 99, [10.0] * 98 + [300.0]
    for r in (1, 2, 3):
        for condition in ("clean", "tail"):
            _write_run(tmp_path, f"gloo-{condition}-gloo-r{r}", "gloo",
                       20.0 if condition == "clean" else 40.0,
                       steady if condition == "clean" else spiky)
            _write_run(tmp_path, f"gloo-{condition}-ps-bl-r{r}", "ps-bl", 21.0, steady)
            _write_run(tmp_path, f"gloo-{condition}-ar-bl-r{r}", "ar-bl", 16.0, steady)
    m = Measured()
    gloo.measure(Files(tmp_path), m, quick=False)
    assert m.values["gloo.tail.time_s.gloo"].value == 40.0
    assert m.values["gloo.tail.p99_ms.gloo"].value == 300.0
    assert m.values["gloo.clean.p50_ms.ps-bl"].value == 10.0
    title, table = m.tables[-1]
    assert "against gloo" in title.lower()
    assert "| 1% random loss (a tail) | a PS | 40.00 | 21.00 | **1.90** |" in table
    assert "| clean network | a PS | 20.00 | 21.00 | **0.95** |" in table
    assert "| clean network | all-reduce | 20.00 | 16.00 | **1.25** |" in table
