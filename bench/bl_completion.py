"""Message completion time of a 4 MB vector, 4 workers -> 1 PS, 1 Gbit/s links, 1% loss.

    .venv/bin/python bench/bl_completion.py [--runs 3] [--rounds 15]

For tcp, udp and bounded-loss p=0.9, side by side in one run (transports interleaved
within every repetition), prints p50/p99 of completion (first byte sent -> message
handed to the PS), the fraction delivered per message, and
p99(tcp) / p99(bounded-loss): medians over --runs repetitions, each on a freshly built
network. Needs root. Loss is the eBPF dropper (or netem) on every access link, both
directions; datagram senders pace at 1 Gbit/s / 4 (their share of the PS's link).
Each run's verdict is judged from the host's CPU over it (bench/hostcheck.py: its
links are not sampled) and the ratios are marked with both transports' verdicts."""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import bl_net, hostcheck  # noqa: E402

ELEMENTS = 1 << 20  # 4 MiB of float32
TRANSPORTS = {
    "tcp": {},
    "udp": {"job": "bl-bench-ct", "rate_bit": 250e6},
    "bounded-loss": {"job": "bl-bench-ct", "p": 0.9, "rate_bit": 250e6},
}


def one(name: str, options: dict, rounds: int, workers: int, port: int) -> dict:
    with bl_net.network("bl-bench-ct", workers, 0.01) as topo:
        ps = topo.pod("ps-0")
        base = {"transport": name, "options": options, "host": ps.ip, "port": port}
        server = bl_net.start(ps, {**base, "role": "ps", "workers": workers,
                                   "rounds": rounds})
        clients = [bl_net.start(topo.pod(f"worker-{i}"),
                                {**base, "role": "worker", "index": i, "elements": ELEMENTS})
                   for i in range(workers)]
        result = bl_net.finish(server)
        for c in clients:
            bl_net.finish(c)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--workers", type=int, default=4)
    hostcheck.add_arguments(ap)
    args = ap.parse_args()
    watch = hostcheck.before(args)
    per: dict[str, dict[str, list[float]]] = {t: {"p50": [], "p99": [], "min_frac": [],
                                                  "mean_frac": []} for t in TRANSPORTS}
    verdicts: dict[str, list[str]] = {t: [] for t in TRANSPORTS}
    for run in range(args.runs):
        for name, options in TRANSPORTS.items():
            run_watch = hostcheck.Watch()
            res = one(name, options, args.rounds, args.workers, 7100 + run)
            fidelity = hostcheck.judged(run_watch.stop())
            verdicts[name].append(hostcheck.verdict_of(fidelity))
            msgs = res["messages"][args.workers:]  # the first round warms up (XDP compile)
            comp = [m["completion_s"] for m in msgs]
            frac = [m["delivered"] for m in msgs]
            per[name]["p50"].append(bl_net.pct(comp, 50))
            per[name]["p99"].append(bl_net.pct(comp, 99))
            per[name]["min_frac"].append(min(frac))
            per[name]["mean_frac"].append(statistics.mean(frac))
            print(f"run {run + 1}/{args.runs} {name:>12}: p50 {1e3 * per[name]['p50'][-1]:7.1f} ms"
                  f"  p99 {1e3 * per[name]['p99'][-1]:7.1f} ms  delivered mean "
                  f"{per[name]['mean_frac'][-1]:.4f} min {per[name]['min_frac'][-1]:.4f}"
                  f"  ({len(msgs)} messages); {hostcheck.during(fidelity)}", flush=True)
    print(f"\n4 MiB vectors, {args.workers} workers -> 1 PS, 1 Gbit/s, 1% loss; medians of "
          f"{args.runs} runs x {args.rounds - 1} rounds:")
    med = {t: {k: statistics.median(v) for k, v in d.items()} for t, d in per.items()}
    for t, m in med.items():
        print(f"  {t:>12}: p50 {1e3 * m['p50']:7.1f} ms  p99 {1e3 * m['p99']:7.1f} ms  "
              f"delivered per message: mean {m['mean_frac']:.4f}, min {min(per[t]['min_frac']):.4f}")
    marked = hostcheck.mark({t: verdicts[t] for t in ("tcp", "bounded-loss")})
    print(f"p99(tcp) / p99(bounded-loss) = {med['tcp']['p99'] / med['bounded-loss']['p99']:.2f} "
          f"{marked}")
    print(f"p50(tcp) / p50(bounded-loss) = {med['tcp']['p50'] / med['bounded-loss']['p50']:.2f} "
          f"{marked}")
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
