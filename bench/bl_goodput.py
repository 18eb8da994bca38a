"""Bounded-loss goodput on a loss-free 1 Gbit/s link, and the time from the packet that
crosses p to the application seeing the message.

    .venv/bin/python bench/bl_goodput.py [--runs 3] [--rounds 15]

One worker sends 4 MiB vectors to the PS; the sender paces at the link's rate, which
the transport reads from the HTB class of its interface (no rate is configured).
Goodput = elements delivered x 4 bytes x 8 / completion time, over the link rate.
Latency = time.monotonic_ns() when recv() returned - bpf_ktime_get_ns() of the XDP
event (the crossing packet), both CLOCK_MONOTONIC. Medians over --runs runs. Root."""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import bl_net  # noqa: E402

ELEMENTS = 1 << 20
LINK_BIT = 1e9


def one(p: float, rounds: int, port: int) -> dict:
    with bl_net.network("bl-bench-gp", 1, 0.0) as topo:
        ps = topo.pod("ps-0")
        base = {"transport": "bounded-loss", "options": {"job": "bl-bench-gp", "p": p},
                "host": ps.ip, "port": port}
        server = bl_net.start(ps, {**base, "role": "ps", "workers": 1, "rounds": rounds})
        client = bl_net.start(topo.pod("worker-0"),
                              {**base, "role": "worker", "index": 0, "elements": ELEMENTS})
        result = bl_net.finish(server)
        bl_net.finish(client)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    goodput: dict[float, list[float]] = {0.9: [], 1.0: []}
    latency_us: list[float] = []
    queued_us: list[float] = []
    for run in range(args.runs):
        for p in goodput:
            res = one(p, args.rounds, 7200 + run)
            msgs = res["messages"][1:]  # round 0 warms up
            gp = [m["delivered"] * ELEMENTS * 32 / m["completion_s"] / LINK_BIT for m in msgs]
            goodput[p].append(statistics.median(gp))
            recs = [r for r in res["records"][1:] if r["event_ns"]]
            if p == 0.9:
                latency_us += [(r["app_ns"] - r["event_ns"]) / 1e3 for r in recs]
                queued_us += [(r["done_ns"] - r["event_ns"]) / 1e3 for r in recs]
            print(f"run {run + 1}/{args.runs} p={p}: goodput {goodput[p][-1]:.3f} of the link, "
                  f"delivered {statistics.mean(m['delivered'] for m in msgs):.4f}, "
                  f"completions by {sorted({r['reason'] for r in res['records']})}", flush=True)
    print("\nloss-free 1 Gbit/s link, 4 MiB messages, one sender paced at the link's rate:")
    for p, v in goodput.items():
        print(f"  bounded-loss p={p}: goodput / link rate = {statistics.median(v):.3f} "
              f"(median of {len(v)} runs; the header overhead caps it at "
              f"{1440 / 1514:.3f})")
    if latency_us:
        print(f"  XDP event (p-crossing packet) -> recv() returns: p50 "
              f"{bl_net.pct(latency_us, 50):.0f} us, p99 {bl_net.pct(latency_us, 99):.0f} us"
              f" ({len(latency_us)} messages); -> message queued for the app: p50 "
              f"{bl_net.pct(queued_us, 50):.0f} us")


if __name__ == "__main__":
    main()
