"""Tests of the per-RPC dissection arithmetic and the concurrent-connection count."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tailcut.training import records, rpc


def _write(path: Path, fields: tuple[str, ...], rows: list[dict[str, object]]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fields))
        w.writeheader()
        w.writerows(rows)


def test_the_five_parts_follow_the_imc20_definitions(tmp_path: Path) -> None:
    us = 1000  # stamps in ns, from t0 = 1 s (a stamp of 0 means "never sent")
    t0 = 10**9
    _write(tmp_path / "rpc-client-worker-0.csv", records.CLIENT_RPC_FIELDS, [{
        "op": "pull", "client": "worker-0", "server": "ps-0", "step": 3,
        "sent_ns": t0, "request_bytes": 28, "reply_arrived_ns": t0 + 100 * us,
        "dequeued_ns": t0 + 130 * us, "done_ns": t0 + 150 * us, "reply_bytes": 4028,
    }])
    _write(tmp_path / "rpc-server-ps-0.csv", records.SERVER_RPC_FIELDS, [{
        "op": "pull", "client": "worker-0", "server": "ps-0", "step": 3, "version": 3,
        "arrived_ns": t0 + 10 * us, "dequeued_ns": t0 + 15 * us, "ready_ns": t0 + 55 * us,
        "replied_ns": t0 + 62 * us, "request_bytes": 28, "reply_bytes": 4028, "nonzero": 0,
    }])
    (row,) = rpc.dissect(tmp_path)
    assert row["w_proc_us"] == 20 and row["w_queue_us"] == 30
    assert row["ps_queue_us"] == 5 and row["ps_sync_us"] == 40 and row["ps_proc_us"] == 7
    assert row["n_tx_us"] == 100 - 5 - 40 - 7  # t1 - t0 - PS_queue - PS_sync - PS_proc
    assert row["total_us"] == 150
    assert (tmp_path / "rpcs.csv").read_text().count("\n") == 2


def test_a_client_row_without_its_server_row_is_left_out(tmp_path: Path) -> None:
    _write(tmp_path / "rpc-client-worker-0.csv", records.CLIENT_RPC_FIELDS, [{
        "op": "push", "client": "worker-0", "server": "ps-0", "step": 0, "sent_ns": 5,
        "request_bytes": 1, "reply_arrived_ns": 9, "dequeued_ns": 9, "done_ns": 9,
        "reply_bytes": 28,
    }])
    _write(tmp_path / "rpc-server-ps-0.csv", records.SERVER_RPC_FIELDS, [])
    assert rpc.dissect(tmp_path) == []


@pytest.mark.parametrize(("arrivals", "expected"), [
    ([], []),
    ([(0, "a"), (500, "b"), (999_999, "a")], [(0, 2)]),
    ([(0, "a"), (1_000_000, "a"), (1_500_000, "b"), (3_200_000, "c")],
     [(0, 1), (1000, 2), (2000, 0), (3000, 1)]),
])
def test_concurrent_connections_count_distinct_clients_per_window(
    arrivals: list[tuple[int, str]], expected: list[tuple[int, int]]
) -> None:
    assert rpc.concurrent_connections(arrivals, window_us=1000) == expected
