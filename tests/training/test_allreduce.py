"""syncMode allreduce: real DDP/Gloo ranks as processes over 127.0.0.1.

Two ranks of the torch MLP, three iterations per epoch: rank 0 reports like a PS
(start, epoch, done; epochs.csv), every rank logs each iteration's all-reduce, and
the model they end with is a bsp PS's: the same gradients averaged, the same steps.
"""

from __future__ import annotations

import csv

import numpy as np
import pytest

from tailcut.ml import data, models, torchmodel
from tailcut.training import allreduce, ps, worker
from tailcut.training.config import ConfigError, RoleConfig
from tests.training.loopback import free_ports, run_ranks

pytestmark = pytest.mark.skipif(not torchmodel.available(),
                                reason="PyTorch is not installed (scripts/setup.sh)")


def _config(tmp_path, index: int, port: int, **extra) -> RoleConfig:
    fields = dict(job="ar", role="worker", index=index, ps_host="127.0.0.1",
                  ps_port=port, num_workers=2, results_dir=str(tmp_path / "results"),
                  model="torch-mlp", batch_size=32, learning_rate=0.3, max_epochs=2,
                  target_accuracy=None, sync_mode="allreduce", timeout_s=120)
    return RoleConfig(**{**fields, **extra})


def _run(tmp_path, **extra) -> list[dict]:
    port = free_ports(1)[0]
    return run_ranks(tmp_path, [_config(tmp_path, i, port, **extra) for i in range(2)])


def test_two_allreduce_ranks_train_and_rank_0_reports_like_a_ps(tmp_path):
    events = _run(tmp_path)
    kinds = [e["event"] for e in events]
    assert kinds == ["start", "epoch", "epoch", "done"]
    done = events[-1]
    ipe = ps.iterations_per_epoch(8000, 32, 2)
    assert done["iterations"] == 2 * ipe and done["stop_reason"] == "max_epochs"
    assert done["role"] == "worker-0" and done["final_accuracy"] > 0.5
    results = tmp_path / "results"
    with open(results / "epochs.csv") as f:
        assert [int(r["iteration"]) for r in csv.DictReader(f)] == [ipe, 2 * ipe]
    for rank in (0, 1):
        with open(results / allreduce.filename(rank)) as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == 2 * ipe
        assert all(float(r["allreduce_ms"]) > 0 and int(r["buckets"]) >= 1 for r in rows)
        assert all(float(r["iteration_ms"]) >= float(r["allreduce_ms"]) for r in rows)


def test_allreduce_steps_as_a_bsp_ps_would_on_the_same_minibatches(tmp_path):
    # past rank 0's go-on verdict at 10 (mid-epoch), then a stop between verdicts
    steps = allreduce.VERDICT_EVERY + 2
    events = _run(tmp_path, max_iterations=steps)
    assert events[-1]["iterations"] == steps
    assert events[-1]["stop_reason"] == "max_iterations"
    # The PS's arithmetic by hand: each worker's next minibatch of its shard, the mean
    # gradient, one step.
    d = models.dataset("torch-mlp", 0)
    m = models.create("torch-mlp", d)
    params = m.init_params(np.random.default_rng(0))
    shards = [data.shard(d.x_train, d.y_train, i, 2) for i in range(2)]
    batches = [worker.minibatches(len(shards[i][0]), 32, np.random.default_rng([0, 1 + i]))
               for i in range(2)]
    for _ in range(steps):
        grads = []
        for i in range(2):
            rows = next(batches[i])
            grads.append(m.loss_and_grad(params, shards[i][0][rows], shards[i][1][rows])[1])
        params = params - 0.3 * (grads[0] + grads[1]) / 2
    loss, accuracy = m.evaluate(params, d.x_test, d.y_test)
    assert events[-1]["final_loss"] == pytest.approx(loss, abs=1e-5)
    assert events[-1]["final_accuracy"] == pytest.approx(accuracy, abs=1e-3)


def test_a_job_past_its_timeout_stops_at_rank_0s_next_verdict_not_at_the_epochs_end(tmp_path):
    ipe = ps.iterations_per_epoch(8000, 2, 2)   # 2,000 steps of batch 2
    done = _run(tmp_path, batch_size=2, timeout_s=1)[-1]
    assert done["stop_reason"] == "timeout"
    assert done["iterations"] % allreduce.VERDICT_EVERY == 0 and done["iterations"] < ipe
    assert done["epochs"] == 0 and done["jct_s"] < 1 + 5   # a few steps past 1 s


def test_allreduce_config_is_refused_for_a_numpy_model_or_a_ps(tmp_path):
    good = _config(tmp_path, 0, 7000).to_dict()
    with pytest.raises(ConfigError, match="sync_mode='allreduce'"):
        RoleConfig(**{**good, "model": "mlp"})
    with pytest.raises(ConfigError, match="sync_mode='allreduce'"):
        RoleConfig(**{**good, "role": "ps"})


@pytest.mark.parametrize("text, gone", [
    ("[./gloo/transport/tcp/pair.cc:589] Read error [127.0.0.1]:26536: Connection reset "
     "by peer", True),
    ("[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer "
     "[10.1.0.3]:41234", True),
    ("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:84] Timed out waiting "
     "1800000ms for recv operation to complete", True),
    # this rank's own mistake: the sizes the ranks exchange disagree
    ("[enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446] "
     "op.preamble.length <= op.nbytes. 8 vs 4", False),
    ("Connection reset by peer", False)])   # not Gloo's
def test_only_gloos_errors_of_a_lost_peer_count_as_another_rank_gone(text, gone):
    assert allreduce.peer_gone(RuntimeError(text)) is gone
