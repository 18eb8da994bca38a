"""Sharded PS, sync modes, aggregator and replica: whole jobs as real processes over 127.0.0.1."""

from __future__ import annotations

import csv
import json
import signal
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from tailcut.training import ps, rpc
from tailcut.training import shards
from tailcut.training.shards import shard_range
from tests.training import loopback


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _server_rows(results: Path, name: str) -> list[dict[str, str]]:
    return _rows(results / f"rpc-server-{name}.csv")


def test_two_shards_each_get_their_half_of_every_push_and_the_job_converges(
    tmp_path: Path,
) -> None:
    job = loopback.Job(tmp_path, num_workers=3, shards=2,
                       options={"target_accuracy": 0.9, "max_epochs": 15})
    events = job.run()
    done = events["ps-0"][-1]
    assert done["converged"] and done["stop_reason"] == "target_accuracy"
    assert events["ps-1"][-1]["stop_reason"] == "stopped_by_ps_0"
    iterations = done["iterations"]
    for shard in (0, 1):
        lo, hi = shards.shard_range(64714, 2, shard)
        pushes = [r for r in _server_rows(job.results, f"ps-{shard}") if r["op"] == "push"]
        assert len(pushes) == 3 * iterations
        assert {int(r["request_bytes"]) for r in pushes} == {28 + 4 * (hi - lo)}
    # every push and pull of every worker is dissected, and no part is negative
    rows = rpc.dissect(job.results)
    assert sum(r["op"] == "push" for r in rows) == 2 * 3 * iterations
    assert sum(r["op"] == "pull" for r in rows) == 2 * 3 * iterations  # the last got STOP
    for r in rows:
        assert all(float(r[p]) >= 0 for p in (*rpc.PARTS, "ps_sync_us")), r
        parts = sum(float(r[p]) for p in (*rpc.PARTS, "ps_sync_us"))
        assert abs(parts - float(r["total_us"])) < 1.0, r  # the parts add up to the whole


def test_shard_ranges_cover_the_vector_once_with_sizes_within_one() -> None:
    for n, shards in [(64714, 1), (64714, 3), (10, 4), (5, 5)]:
        ranges = [shard_range(n, shards, s) for s in range(shards)]
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        sizes = [hi - lo for lo, hi in ranges]
        assert max(sizes) - min(sizes) <= 1


def test_async_job_answers_every_pull_at_once_and_converges(tmp_path: Path) -> None:
    job = loopback.Job(tmp_path, num_workers=3, shards=2,
                       options={"target_accuracy": 0.9, "max_epochs": 15, "sync_mode": "async"})
    done = job.run()["ps-0"][-1]
    assert done["converged"]
    assert done["updates"] == 3 * done["iterations"]
    pulls = [r for r in _server_rows(job.results, "ps-0") if r["op"] == "pull"]
    assert pulls and all(r["ready_ns"] == r["dequeued_ns"] for r in pulls)
    # pushes are applied one by one: the model version moves with every push
    versions = [int(r["version"]) for r in _server_rows(job.results, "ps-0") if r["op"] == "push"]
    assert versions == list(range(1, len(versions) + 1))


def test_ssp_never_lets_a_worker_run_more_than_staleness_steps_ahead(tmp_path: Path) -> None:
    staleness = 1
    job = loopback.Job(tmp_path, num_workers=4,
                       options={"target_accuracy": 0.9, "max_epochs": 15, "sync_mode": "ssp",
                                "staleness": staleness})
    assert job.run()["ps-0"][-1]["converged"]
    rows = _server_rows(job.results, "ps-0")
    pushes_applied = defaultdict(list)  # worker -> times its pushes were applied
    for r in rows:
        if r["op"] == "push":
            pushes_applied[r["client"]].append(int(r["replied_ns"]))
    for r in rows:
        if r["op"] != "pull":
            continue
        answered = int(r["replied_ns"])
        slowest = min(sum(t <= answered for t in times) for times in pushes_applied.values())
        assert int(r["step"]) - slowest <= staleness, r
    # and the bound did bind: some pulls waited for the slowest worker
    assert any(int(r["ready_ns"]) > int(r["dequeued_ns"]) for r in rows if r["op"] == "pull")


def test_an_aggregator_sums_its_group_so_training_matches_a_job_without_it(
    tmp_path: Path,
) -> None:
    options = {"max_iterations": 30, "target_accuracy": None}
    plain = loopback.Job(tmp_path / "plain", num_workers=4, options=options)
    via = loopback.Job(tmp_path / "via", num_workers=4, groups=[[0, 1]],
                       options={**options, "ordering": "stf"})
    plain_done = plain.run()["ps-0"][-1]
    via_done = via.run()["ps-0"][-1]
    assert via_done["iterations"] == plain_done["iterations"] == 30
    assert abs(via_done["final_loss"] - plain_done["final_loss"]) < 1e-4
    clients = {r["client"] for r in _server_rows(via.results, "ps-0") if r["op"] == "push"}
    assert clients == {"aggregator-0", "worker-2", "worker-3"}
    agg = _server_rows(via.results, "aggregator-0")
    assert {r["client"] for r in agg} == {"worker-0", "worker-1"} and len(agg) == 2 * 30
    # the worker's push RPCs to the aggregator are dissected too
    rows = rpc.dissect(via.results)
    assert {r["server"] for r in rows if r["client"] == "worker-0" and r["op"] == "push"} == {
        "aggregator-0"}


def test_killing_the_primary_mid_job_hands_over_to_the_replica_which_finishes(
    tmp_path: Path,
) -> None:
    job = loopback.Job(tmp_path, num_workers=3, replica=True,
                       options={"target_accuracy": 0.93, "max_epochs": 10})
    job.start()
    primary = job.procs.pop("ps-0")
    try:
        for line in primary.stdout:  # type: ignore[union-attr]
            if json.loads(line)["event"] == "epoch":
                break
        primary.send_signal(signal.SIGKILL)
        primary.wait(10)
    finally:
        primary.kill()
    events = job.finish()
    replica = events["replica-0"]
    takeover = next(e for e in replica if e["event"] == "takeover")
    done = replica[-1]
    assert done["converged"] and done["takeover"] == {k: takeover[k] for k in done["takeover"]}
    assert takeover["iteration"] > 0  # mid-job: the primary had trained (it logged an epoch)
    assert all("failed_over" in events[f"worker-{w}"][-1] for w in range(3))
    epochs = _rows(job.results / "epochs.csv")
    assert [int(r["epoch"]) for r in epochs] == list(range(1, done["epochs"] + 1))
    assert json.loads((job.results / "takeover.json").read_text()) == done["takeover"]
    assert np.load(job.results / "updates-replica-0.npz")["counts"].sum() > 0
    # bsp is deterministic: the replica saw every update, so the run goes on exactly
    # as one whose PS never died
    plain = loopback.Job(tmp_path / "plain", num_workers=3,
                         options={"target_accuracy": 0.93, "max_epochs": 10})
    plain.run()
    assert [r["test_loss"] for r in epochs] == [
        r["test_loss"] for r in _rows(plain.results / "epochs.csv")]


@pytest.mark.parametrize("transport", [
    {"type": "udp", "job": "roles-dg"},
    {"type": "bounded-loss", "p": 0.9, "xdp": False, "job": "roles-dg"}],
    ids=["udp", "bounded-loss"])
def test_shards_an_aggregator_and_a_replica_start_over_the_datagram_transports(
    tmp_path: Path, transport: dict
) -> None:
    """Shard 1, the aggregator and the replica listen and then connect upstream: their
    connections share the one UDP socket listen opened (they once connected first and
    then failed to listen)."""
    options = {"max_iterations": 5, "target_accuracy": None, "transport": transport}
    sharded = loopback.Job(tmp_path / "sharded", num_workers=3, shards=2, groups=[[0, 1]],
                           options=options)
    events = sharded.run()
    assert events["ps-0"][-1]["iterations"] == 5
    assert events["aggregator-0"][-1]["rounds"] == 5
    replicated = loopback.Job(tmp_path / "replicated", num_workers=2, replica=True,
                              options=options)
    assert replicated.run()["ps-0"][-1]["iterations"] == 5
