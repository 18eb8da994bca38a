"""Coflow pacing on a real shaped link: do flows of different sizes end together?

    sudo .venv/bin/python bench/coflow_pacing.py [--rounds 5] [--kbytes 400,1200,3600]

One PS and one worker on a rack, the access links shaped by HTB to --rate; the PS
sends one TCP flow per size at once (tailcut.scheduling.exchange, no compute), first
unpaced (TCP fair share), then paced (coflow: each sender capped by SO_MAX_PACING_RATE
at its MADD rate, size / Gamma). Prints each flow's completion time relative to the
coflow's bottleneck time Gamma, and the spread (last - first) / last, medians of
--rounds rounds.

    --rate 10Gbit --pace-mbit 100   pace as if the link were 100 Mbit/s on a link
                                    that does not limit them: the caps alone
    --kbytes 400                    a lone flow: how exact is one paced socket
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import hostcheck  # noqa: E402
from tailcut import spec  # noqa: E402
from tailcut.net import build, topology  # noqa: E402
from tailcut.scheduling import exchange, madd  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kbytes", default="400,1200,3600")
    parser.add_argument("--rate", default="100Mbit")
    parser.add_argument("--pace-mbit", type=float, default=None,
                        help="compute the MADD rates for links of this rate instead of "
                             "--rate")
    parser.add_argument("--period-ms", type=float, default=None,
                        help="also recompute the rates this often (default: only when a "
                             "flow starts or ends)")
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (it builds network namespaces)", file=sys.stderr)
        return 2
    watch = hostcheck.before(args)
    sizes = [int(float(v) * 1000) for v in args.kbytes.split(",")]
    job = spec.from_dict({
        "apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": f"cof-bench-{os.getpid()}"},
        "spec": {"replicas": {"workers": 1},
                 "network": {"accessLink": {"bandwidth": args.rate}}}})
    topo = topology.plan(job)
    layers = [exchange.LayerLoad(f"f{k}", b, 0.0, 0.0) for k, b in enumerate(sizes)]
    capacity = madd.capacities(topo)
    if args.pace_mbit:
        scale = args.pace_mbit * 1e6 / job.spec.network.access_link.bandwidth
        capacity = {link: c * scale for link, c in capacity.items()}
    gamma = sum(sizes) / capacity["ps-0/up"]
    ends: dict[str, list[list[float]]] = {"fair": [], "coflow": []}
    network = build.build(topo, has_netem=False)
    try:
        for r in range(args.rounds):
            for i, policy in enumerate(ends):
                it = exchange.run(topo, layers, 1, tagged=False, paced=policy == "coflow",
                                  port=exchange.PORT + 2 * r + i,
                                  pacer_period_s=args.period_ms and args.period_ms / 1e3,
                                  pace_capacity=capacity)[0]
                ends[policy].append([it.pull_done_s[(0, k)] for k in range(len(sizes))])
    finally:
        network.destroy()
    paced_as = f", paced as if {args.pace_mbit:g} Mbit/s" if args.pace_mbit else ""
    print(f"flows of {args.kbytes} kB from the PS at once over {args.rate}{paced_as}; Gamma "
          f"{gamma * 1e3:.1f} ms (at {madd.HEADROOM:g} of the goodput); medians of "
          f"{args.rounds} rounds")
    print(f"{'':>8} " + " ".join(f"{f'{b // 1000} kB / Gamma':>16}" for b in sizes)
          + f" {'spread':>8}")
    for policy, runs in ends.items():
        cols = [statistics.median(run[k] for run in runs) / gamma for k in range(len(sizes))]
        spread = statistics.median((max(run) - min(run)) / max(run) for run in runs)
        if policy == "fair" and args.pace_mbit:
            continue  # unpaced on an unlimiting link: nothing to compare
        print(f"{policy:>8} " + " ".join(f"{c:>16.3f}" for c in cols) + f" {spread:>8.3f}")
        print(f"{'':>8} spread per round: " + ", ".join(
            f"{(max(run) - min(run)) / max(run):.3f}" for run in runs))
        print(f"{'':>8} range over rounds: " + ", ".join(
            f"{min(run[k] for run in runs) / gamma:.3f}-{max(run[k] for run in runs) / gamma:.3f}"
            for k in range(len(sizes))))
    hostcheck.after(watch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
