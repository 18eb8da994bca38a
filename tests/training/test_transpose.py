"""syncMode allreduce over a datagram transport: the transpose all-reduce's ranks as
real processes over 127.0.0.1 (tailcut.training.transpose).

Three ranks of the torch MLP: with p = 1 (and over udp, which loses nothing on
loopback) the model they end with is a bsp PS's on the same minibatches; with p < 1 every message keeps at least p and rank 0 reports as
the Gloo ranks do (start, epoch, done; epochs.csv, allreduce-worker-<i>.csv)."""

from __future__ import annotations

import csv
import os
import re

import numpy as np
import pytest

from tailcut import errors
from tailcut.ml import data, models, torchmodel
from tailcut.training import (allreduce, exits, ps, records, relay, syncmodes, transpose,
                              worker)
from tailcut.training.shards import shard_range
from tailcut.training.config import RoleConfig
from tailcut.transports import base, datagram
from tailcut.transports.base import Kind, Message
from tests import waiting
from tests.training.loopback import free_ports, run_ranks, start_ranks

pytestmark = pytest.mark.skipif(not torchmodel.available(),
                                reason="PyTorch is not installed (scripts/setup.sh)")
RANKS = 3


def _configs(tmp_path, transport: dict, **extra) -> list[RoleConfig]:
    ports = free_ports(RANKS)
    fields = dict(job="tar", role="worker", ps_host="127.0.0.1", ps_port=ports[0],
                  num_workers=RANKS, results_dir=str(tmp_path / "results"),
                  model="torch-mlp", batch_size=32, learning_rate=0.3, max_epochs=1,
                  target_accuracy=None, sync_mode="allreduce", timeout_s=120,
                  transport=transport,
                  shard_endpoints=[f"127.0.0.1:{port}" for port in ports])
    fields.update(extra)
    return [RoleConfig(index=i, **fields) for i in range(RANKS)]


def _run(tmp_path, transport: dict, **extra) -> list[dict]:
    return run_ranks(tmp_path, _configs(tmp_path, transport, **extra))


@pytest.mark.parametrize("transport, racks", [
    ({"type": "bounded-loss", "p": 1.0, "xdp": False, "job": "tar"}, None),
    # ranks 0 and 1 in one rack, 2 in another: each rack's relay (training.relay)
    ({"type": "bounded-loss", "p": 1.0, "xdp": False, "job": "tar"}, [0, 0, 1]),
    # Nothing lost needs the 32 MB socket buffers only root may force.
    pytest.param({"type": "udp", "job": "tar"}, None, marks=pytest.mark.skipif(
        os.geteuid() != 0, reason="udp's socket buffers need root"))],
    ids=["bounded-loss-p1", "bounded-loss-p1-two-racks", "udp"])
def test_with_everything_delivered_the_ranks_step_as_a_bsp_ps_would(tmp_path, transport,
                                                                     racks):
    # 12: past rank 0's go-on verdict at 10 (mid-epoch), then a stop between verdicts
    steps = allreduce.VERDICT_EVERY + 2
    events = _run(tmp_path, transport, max_iterations=steps, rank_racks=racks)
    assert events[-1]["iterations"] == steps
    assert events[-1]["stop_reason"] == "max_iterations"
    assert events[-1]["allreduce"] == "transpose"
    d = models.dataset("torch-mlp", 0)
    m = models.create("torch-mlp", d)
    params = m.init_params(np.random.default_rng(0))
    shards = [data.shard(d.x_train, d.y_train, i, RANKS) for i in range(RANKS)]
    batches = [worker.minibatches(len(shards[i][0]), 32, np.random.default_rng([0, 1 + i]))
               for i in range(RANKS)]
    for _ in range(steps):
        grads = []
        for i in range(RANKS):
            rows = next(batches[i])
            grads.append(m.loss_and_grad(params, shards[i][0][rows], shards[i][1][rows])[1])
        params = params - 0.3 * sum(grads) / RANKS
    loss, accuracy = m.evaluate(params, d.x_test, d.y_test)
    assert events[-1]["final_loss"] == pytest.approx(loss, abs=1e-5)
    assert events[-1]["final_accuracy"] == pytest.approx(accuracy, abs=1e-3)


def test_a_job_past_its_timeout_stops_at_rank_0s_next_verdict_not_at_the_epochs_end(tmp_path):
    ipe = ps.iterations_per_epoch(8000, 2, RANKS)   # 1,333 steps of batch 2
    events = _run(tmp_path, {"type": "bounded-loss", "p": 1.0, "xdp": False, "job": "tar"},
                  batch_size=2, timeout_s=1)
    done = events[-1]
    assert done["stop_reason"] == "timeout"
    assert done["iterations"] % allreduce.VERDICT_EVERY == 0 and done["iterations"] < ipe
    assert done["epochs"] == 0 and done["jct_s"] < 1 + 5   # a few steps past 1 s
    assert done["final_accuracy"] > 0   # evaluated at the stop


def test_with_p_below_1_every_message_keeps_p_and_rank_0_reports_an_epoch(tmp_path):
    # Two racks, so that relays sum and hand on (one rack, the plain transpose, is
    # test_relay.py's and the p = 1 test's).
    racks = [0, 0, 1]
    # Paced (on loopback nothing else is): DONE at p stops each pass before its end.
    events = _run(tmp_path, {"type": "bounded-loss", "p": 0.8, "xdp": False, "job": "tar",
                             "rate_bit": 200e6}, rank_racks=racks)
    assert [e["event"] for e in events] == ["start", "epoch", "done"]
    ipe = ps.iterations_per_epoch(8000, 32, RANKS)
    done = events[-1]
    assert done["iterations"] == ipe and done["stop_reason"] == "max_epochs"
    assert done["final_accuracy"] > 0.5
    results = tmp_path / "results"
    num_params = models.create("torch-mlp", models.dataset("torch-mlp", 0)).num_params
    layout = relay.Racks.of(RANKS, racks)
    for rank in range(RANKS):
        with open(results / allreduce.filename(rank)) as f:
            steps = list(csv.DictReader(f))
        assert len(steps) == ipe
        assert all(float(r["allreduce_ms"]) > 0 for r in steps)
        with open(results / records.messages_filename("worker", rank)) as f:
            received = list(csv.DictReader(f))
        assert len(received) == ipe * _messages_to(layout, rank)   # relay.py's plan
        for r in received:
            shards = _shards_in(layout, r["kind"], int(r["sender"]), rank)
            size = sum(np.diff(shard_range(num_params, RANKS, k))[0] for k in shards)
            assert int(r["missing"]) <= size - datagram.threshold_elements(0.8, size)
        assert any(int(r["missing"]) > 0 for r in received)   # p left some out


def _shards_in(layout: relay.Racks, kind: str, sender: int, receiver: int) -> list[int]:
    """The shards a message of ``kind`` from ``sender`` to ``receiver`` holds."""
    if sender in layout.peers(receiver):   # a gather, or a scatter
        return layout.handles(receiver if kind == "PUSH" else sender)
    return [receiver] if kind == "PUSH" else [sender]   # a relay's sum, an owner's PARAMS


def _messages_to(layout: relay.Racks, rank: int) -> int:
    return (2 * len(layout.peers(rank)) + len(layout.relays_of(rank))
            + len(layout.relayed(rank)))


class _Replay(base.Connection):
    """A connection that hands out the given messages in order (a unit test of the
    demultiplexing only)."""

    def __init__(self, messages: list[Message]) -> None:
        self.messages = list(messages)

    def send(self, msg: Message, timeout_s: float | None = None) -> None:
        raise AssertionError("not sent in this test")

    def recv(self, timeout_s: float | None = None) -> Message:
        return self.messages.pop(0)

    def close(self) -> None:
        pass


def test_what_arrived_of_a_push_is_summed_and_counted_coordinate_by_coordinate():
    total = np.array([1.0, 1.0, 1.0, 1.0])
    counts = np.ones(4, dtype=np.int32)
    mask = np.array([True, False, True, False])
    syncmodes.accumulate(total, counts, Message(Kind.PUSH, 0, 1, np.array(
        [2, 9, 4, 9], dtype=np.float32), mask), 4, 1)
    assert total.tolist() == [3, 1, 5, 1] and counts.tolist() == [2, 1, 2, 1]
    # a relay's sum of a rack of 2: the mean of what arrived, times 2
    assert transpose._rack_sum(total, counts, 2).tolist() == [3, 2, 5, 2]
    syncmodes.accumulate(total, counts, Message(Kind.PUSH, 0, 1, np.array(
        [10, 20, 30, 40], dtype=np.float32), mask), 4, 2)   # a relay's: 2 gradients
    assert total.tolist() == [13, 1, 35, 1] and counts.tolist() == [4, 1, 4, 1]
    params = np.zeros(6, dtype=np.float32)
    worker.apply_params(params[2:5], Message(Kind.PARAMS, 0, 2, np.array(
        [7, 9, 8], dtype=np.float32), np.array([True, False, True])))
    assert params.tolist() == [0, 0, 7, 0, 8, 0]   # a missing value keeps the old one
    got = Message(Kind.PARAMS, 0, 2, np.ones(5, dtype=np.float32))
    with pytest.raises(errors.RunError, match="worker 2's PARAMS has 5 values; shards 0, 1 "
                                              "hold 6"):
        transpose._split(got, [(0, 3), (3, 6)], [0, 1], 2)


def test_a_message_that_comes_early_waits_and_a_stale_one_is_refused_naming_the_rank(tmp_path):
    values = np.ones(4, dtype=np.float32)
    conn = _Replay([Message(Kind.PUSH, 1, 2, values), Message(Kind.PARAMS, 0, 2, values),
                    # rank 0's verdict, a control frame, overtakes its PARAMS
                    Message(Kind.ACK, 1, 0), Message(Kind.PARAMS, 1, 0, values),
                    Message(Kind.STOP, 2, 0), Message(Kind.PARAMS, 2, 0, values),
                    Message(Kind.PUSH, 0, 2, values)])
    with records.CsvLog(tmp_path / "m.csv", records.MESSAGE_FIELDS) as log:
        mesh = transpose._Peers({2: conn, 0: conn}, log, rank=1, wait_s=5)
        assert mesh.take(2, (Kind.PARAMS,), 0).kind == Kind.PARAMS   # PUSH 1 waits
        assert mesh.take(2, (Kind.PUSH,), 1).iteration == 1          # ... until asked
        assert mesh.take(0, (Kind.PARAMS,), 1).kind == Kind.PARAMS   # ACK 1 waits
        assert mesh.take(0, (Kind.ACK, Kind.STOP), 1).kind == Kind.ACK
        assert mesh.take(0, (Kind.PARAMS,), 2).iteration == 2        # STOP 2 waits
        assert mesh.take(0, (Kind.ACK, Kind.STOP), 2).kind == Kind.STOP
        with pytest.raises(errors.RunError, match="worker 2 sent PUSH for iteration 0 "
                                                  "while worker 1 waited for PUSH of 3"):
            mesh.take(2, (Kind.PUSH,), 3)
    assert len(list(csv.DictReader(open(tmp_path / "m.csv")))) == 5   # data only


@pytest.mark.parametrize("msg, why", [
    (Message(Kind.PULL, 0, 2), "worker 2 sent PULL; all-reduce ranks send PUSH/PARAMS/ACK/STOP"),
    (Message(Kind.PUSH, 2, 2, np.ones(4, dtype=np.float32)),
     "worker 2 sent PUSH for iteration 2 while worker 1 waited for PARAMS of 0")],
    ids=["kind", "too-far-ahead"])
def test_a_message_no_rank_sends_is_refused_naming_the_rank(tmp_path, msg, why):
    with records.CsvLog(tmp_path / "m.csv", records.MESSAGE_FIELDS) as log:
        mesh = transpose._Peers({2: _Replay([msg])}, log, rank=1, wait_s=5)
        with pytest.raises(errors.RunError, match=why):
            mesh.take(2, (Kind.PARAMS,), 0)


@pytest.mark.parametrize("transport", [
    {"type": "bounded-loss", "p": 1.0, "xdp": False, "job": "tar"},
    {"type": "tcp", "job": "tar"}], ids=["transpose", "gloo"])
def test_a_rank_killed_mid_run_makes_the_others_exit_saying_it_went_away(tmp_path, transport):
    """The others fail as peers of a role that went away (exit code PEER_GONE), saying
    so, at once and not at their timeout, so the job blames the rank that died."""
    procs = start_ranks(tmp_path, _configs(tmp_path, transport, batch_size=2, max_epochs=5))
    try:
        steps = tmp_path / "results" / allreduce.filename(0)
        assert waiting.until(lambda: steps.exists() and len(steps.read_text().splitlines()) > 20,
                             within_s=120, every_s=0.2), "training did not start"
        procs[2].kill()
        errs = []
        for p in procs[:2]:
            _, err = p.communicate(timeout=60)   # far less than timeout_s
            assert p.returncode == exits.PEER_GONE, err
            errs.append(err)
        if transport["type"] == "tcp":   # Gloo's errors name an address, not a rank
            assert all("another rank went away or stopped answering (Gloo: " in err
                       for err in errs), errs
        else:
            # A survivor may see the other one leave first, but the first to notice
            # anything noticed worker 2.
            assert all(re.search(r"worker [0-2] went away", err) for err in errs), errs
            assert any("worker 2 went away" in err for err in errs), errs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
