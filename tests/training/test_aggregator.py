"""Tests of the aggregator role at the end of a job, against scripted shards and a member."""

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from tailcut.ml import models
from tailcut.training import exits, peers
from tailcut.training.config import RoleConfig
from tailcut.transports import base, tcp
from tailcut.transports.base import Kind, Message

# Below the ephemeral range (32768-60999), so no outgoing connection holds them.
SHARD_PORTS = (27411, 27412)
AGGREGATOR_PORT = 27413


def _shard(index: int, seen: list[Message], stop_after_s: float | None) -> None:
    """ps-`index`: takes the aggregator's HELLO; ps-1 then closes at once (as when
    ps-0's STOP reached it first); ps-0 takes the forwarded PUSH(0) and says STOP
    `stop_after_s` later (None: never; it only waits until the aggregator leaves)."""
    transport = tcp.TcpTransport()
    (conn,) = transport.listen("127.0.0.1", SHARD_PORTS[index], 1, timeout_s=30)
    try:
        seen.append(conn.recv(timeout_s=30))
        if index == 1:
            return
        seen.append(conn.recv(timeout_s=30))
        if stop_after_s is not None:
            time.sleep(stop_after_s)
            conn.send(Message(Kind.STOP, 1, base.PS_SENDER))
        conn.recv(timeout_s=30)   # until the aggregator closes
    except base.TransportError:
        pass
    finally:
        conn.close()
        transport.close()


def _member(num_params: int) -> None:
    """worker-0: pushes its PUSH(0) to the aggregator, then waits for it to leave."""
    transport = tcp.TcpTransport()
    conn = peers.hello(transport, "127.0.0.1", AGGREGATOR_PORT, peers.WORKER, 0,
                       time.monotonic() + 30)
    try:
        conn.send(Message(Kind.PUSH, 0, 0, np.ones(num_params, np.float32)))
        while True:
            conn.recv(timeout_s=30)
    except base.TransportError:
        pass
    finally:
        conn.close()
        transport.close()


def _run_aggregator(tmp_path: Path, stop_after_s: float | None) -> tuple[
        subprocess.CompletedProcess, list[Message]]:
    num_params = models.create("mlp", models.dataset("mlp", 0)).num_params
    cfg = RoleConfig(job="agg-end", role="aggregator", index=0, ps_host="127.0.0.1",
                     ps_port=SHARD_PORTS[0], num_workers=1, results_dir=str(tmp_path),
                     timeout_s=30,
                     shard_endpoints=[f"127.0.0.1:{p}" for p in SHARD_PORTS],
                     aggregators=[{"endpoint": f"127.0.0.1:{AGGREGATOR_PORT}", "workers": [0]}])
    cfg.to_json(tmp_path / "aggregator.json")
    seen: list[Message] = []
    threads = [threading.Thread(target=_shard, args=(0, seen, stop_after_s)),
               threading.Thread(target=_shard, args=(1, [], None)),
               threading.Thread(target=_member, args=(num_params,))]
    for t in threads:
        t.start()
    proc = subprocess.run(
        [sys.executable, "-m", "tailcut.training.role", str(tmp_path / "aggregator.json")],
        capture_output=True, text=True, timeout=60)
    for t in threads:
        t.join(timeout=60)
    return proc, seen


def test_a_shard_closing_before_ps_0s_stop_arrives_ends_the_aggregator_cleanly(
        tmp_path: Path) -> None:
    proc, seen = _run_aggregator(tmp_path, stop_after_s=0.5)
    assert proc.returncode == exits.OK, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["event"] == "aggregator_done"
    assert [(m.kind, m.iteration) for m in seen] == [(Kind.HELLO, peers.AGGREGATOR),
                                                     (Kind.PUSH, 0)]


def test_a_shard_closing_with_no_stop_following_fails_the_aggregator_naming_it(
        tmp_path: Path) -> None:
    proc, _ = _run_aggregator(tmp_path, stop_after_s=None)
    assert proc.returncode != exits.OK
    assert f"ps-1 at 127.0.0.1:{SHARD_PORTS[1]}" in proc.stderr, proc.stderr
