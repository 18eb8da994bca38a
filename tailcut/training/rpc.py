"""Per-RPC latency dissection as the IMC'20 paper defines it, from both sides' stamps.

For every push and pull a client (worker or aggregator) and a server (PS shard,
replica or aggregator) each log their stamps (records.CLIENT_RPC_FIELDS and
records.SERVER_RPC_FIELDS). Pods share one host clock, so joining the two rows
gives the paper's five parts (Fig. 3) without piggybacking them on the reply::

    client  t0 sent ....................................... t1 reply in queue -> dequeued -> done
    server        arrived -> dequeued -> ready -> replied
                  |PS_queue|  (sync)   |PS_proc|
    W_queue = dequeued_c - t1     W_proc  = done_c - dequeued_c
    PS_queue = dequeued_s - arrived  PS_proc = replied - ready
    N_tx = (t1 - t0) - PS_queue - PS_sync - PS_proc

``PS_sync`` (ready - dequeued) is ours, not the paper's: the time a pull was held
for the BSP barrier or the SSP staleness bound. The paper's system has no such
wait inside an RPC; counting it as network time would blame the network for
stragglers, so it is kept apart (and shown in the breakdown as its own bar).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

DISSECTION_FIELDS = (
    "op", "client", "server", "step", "sent_ns",
    "w_proc_us", "w_queue_us", "ps_proc_us", "ps_queue_us", "ps_sync_us", "n_tx_us",
    "total_us", "request_bytes", "response_bytes",
)
PARTS = ("w_proc_us", "w_queue_us", "ps_proc_us", "ps_queue_us", "n_tx_us")


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def dissect(results_dir: str | Path) -> list[dict[str, object]]:
    """Join every rpc-client-*.csv row with its server row; write and return rpcs.csv.

    A client row whose server row is missing (a passive replica, a PS killed
    before it flushed) is left out: without the server's stamps it cannot be cut.
    """
    results = Path(results_dir)
    server: dict[tuple[str, str, str, str], dict[str, str]] = {}
    for path in sorted(results.glob("rpc-server-*.csv")):
        for row in _rows(path):
            server[(row["op"], row["client"], row["server"], row["step"])] = row
    out: list[dict[str, object]] = []
    for path in sorted(results.glob("rpc-client-*.csv")):
        for c in _rows(path):
            s = server.get((c["op"], c["client"], c["server"], c["step"]))
            if s is None or int(c["sent_ns"]) == 0:
                continue
            t0, t1 = int(c["sent_ns"]), int(c["reply_arrived_ns"])
            ps_queue = int(s["dequeued_ns"]) - int(s["arrived_ns"])
            ps_sync = int(s["ready_ns"]) - int(s["dequeued_ns"])
            ps_proc = int(s["replied_ns"]) - int(s["ready_ns"])
            w_queue = int(c["dequeued_ns"]) - t1
            w_proc = int(c["done_ns"]) - int(c["dequeued_ns"])
            n_tx = (t1 - t0) - ps_queue - ps_sync - ps_proc
            out.append({
                "op": c["op"], "client": c["client"], "server": c["server"],
                "step": int(c["step"]), "sent_ns": t0,
                "w_proc_us": w_proc / 1e3, "w_queue_us": w_queue / 1e3,
                "ps_proc_us": ps_proc / 1e3, "ps_queue_us": ps_queue / 1e3,
                "ps_sync_us": ps_sync / 1e3, "n_tx_us": n_tx / 1e3,
                "total_us": (int(c["done_ns"]) - t0) / 1e3,
                "request_bytes": int(s["request_bytes"]),
                "response_bytes": int(c["reply_bytes"]),
            })
    out.sort(key=lambda r: int(r["sent_ns"]))  # type: ignore[call-overload]
    with open(results / "rpcs.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(DISSECTION_FIELDS))
        writer.writeheader()
        writer.writerows(out)
    return out


def concurrent_connections(
    arrivals: Iterable[tuple[int, str]], window_us: int
) -> list[tuple[int, int]]:
    """The paper's concurrent active connections: distinct clients per time window.

    ``arrivals`` holds (arrived_ns, client) for every request a server received;
    returns (window start in us since the first request, distinct clients) for
    every window from the first request to the last, empty windows included.
    """
    items = sorted(arrivals)
    if not items:
        return []
    start = items[0][0]
    width = window_us * 1000
    last = (items[-1][0] - start) // width
    clients: list[set[str]] = [set() for _ in range(last + 1)]
    for t, who in items:
        clients[(t - start) // width].add(who)
    return [(i * window_us, len(c)) for i, c in enumerate(clients)]


def write_connections(path: str | Path, arrivals: Iterable[tuple[int, str]], window_us: int) -> None:
    """connections-<server>.csv: window_start_us, active_connections."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["window_start_us", "active_connections"])
        writer.writerows(concurrent_connections(arrivals, window_us))
