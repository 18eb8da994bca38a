"""CadentFlow on the testbed: iteration time with priority classes vs TCP fair share,
measured side by side, and the simulator's prediction for the same case.

    sudo .venv/bin/python bench/cadentflow_testbed.py [--rounds 5] [--workers 2]

Builds a real job network (1 PS + n workers on one rack, access links shaped by HTB to
--rate), then alternates rounds of `fair` (every tensor its own TCP flow, default
class) and `cadentflow` (the same flows tagged per layer, HTB priority classes and the
DSCP classifier on every pod) and reports medians. Compute is emulated per layer
(tailcut.scheduling.exchange). The same model, link rate and placement run in the
flow-level simulator (fair = per-tensor TCP, cadentflow = priority), at the TCP
goodput of the link (1448 payload bytes per 1514-byte frame).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tailcut import spec  # noqa: E402
from tailcut.net import build, topology  # noqa: E402
from tailcut.scheduling import enforce, exchange, tags  # noqa: E402
from tailcut.simulate import architectures, engine  # noqa: E402
from tailcut.simulate import topology as simtopo  # noqa: E402

GOODPUT = 1448 / 1514


def model(layers: int, layer_bytes: int, fwd_s: float) -> list[exchange.LayerLoad]:
    return [exchange.LayerLoad(f"l{k}", layer_bytes, fwd_s, 2 * fwd_s) for k in range(layers)]


def simulate(loads: list[exchange.LayerLoad], workers: int, rate_bit: float) -> dict[str, float]:
    """The same case in the simulator (one priority level per layer: run with
    --layers <= 4 so the testbed has a class per layer too)."""
    layers = tuple(architectures.Layer(l.name, l.bytes // 4, 1, l.fwd_s, l.bwd_s)
                   for l in loads)
    arch = architectures.Architecture("testbed", layers, 1, "bench")
    out = {}
    for name, policy, tcp in (("fair", "fair", "per-tensor"),
                              ("cadentflow", "cadentflow", "ordered")):
        fabric = simtopo.star(1 + workers, rate_bit * GOODPUT)
        job = engine.Job("t", arch, list(range(1, 1 + workers)), [0])
        sim = engine.Simulation(fabric, [job], policy, tcp=tcp)  # type: ignore[arg-type]
        out[name] = sim.run().mean_iteration_s()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=3, help="per round")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--layer-kbytes", type=int, default=1000)
    parser.add_argument("--fwd-ms", type=float, default=100.0, help="forward time per layer")
    parser.add_argument("--rate", default="100Mbit")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (it builds network namespaces)", file=sys.stderr)
        return 2
    levels = min(args.layers, 4)
    job = spec.from_dict({
        "apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": f"cf-bench-{os.getpid()}"},
        "spec": {"replicas": {"workers": args.workers},
                 "network": {"accessLink": {"bandwidth": args.rate},
                             "uplink": {"bandwidth": args.rate}},
                 "scheduling": {"policy": "cadentflow", "priorityLevels": levels}}})
    loads = model(args.layers, args.layer_kbytes * 1000, args.fwd_ms / 1000)
    # The job's tags: derived from the model by the spec's rules (one connection per
    # tensor carries its pull and its push, so it takes the pull's level).
    resolved = tags.resolve(job.spec.scheduling, [l.name for l in loads],
                            [l.fwd_s for l in loads])
    level_by_layer = [int(resolved[(l.name, "pull")].priority or 0) for l in loads]
    topo = topology.plan(job)
    network = build.build(topo, has_netem=False)
    times: dict[str, list[float]] = {"fair": [], "cadentflow": []}
    try:
        for r in range(args.rounds):
            for policy in ("fair", "cadentflow"):
                handle = None
                if policy == "cadentflow":
                    handle = enforce.apply(topo, job.spec.scheduling)
                try:
                    its = exchange.run(topo, loads, args.iterations,
                                       tagged=policy == "cadentflow", levels=levels,
                                       port=exchange.PORT + r,
                                       level_by_layer=level_by_layer)
                finally:
                    if handle is not None:
                        counts = handle.counts()
                        handle.detach()
                median = statistics.median(i.seconds for i in its)
                times[policy].append(median)
                print(f"round {r}: {policy:>10} iteration {median * 1e3:7.1f} ms "
                      f"(median of {args.iterations})", flush=True)
        ps_counts = counts[f"{topo.pod('ps-0').netns}/eth0"]
        print("PS egress packets per class in the last cadentflow round: " + ", ".join(
            f"{'default' if k is None else f'level {k}'} {v[0]}" for k, v in ps_counts.items()
            if v[0]))
    finally:
        network.destroy()
    fair = statistics.median(times["fair"])
    cadent = statistics.median(times["cadentflow"])
    sim = simulate(loads, args.workers, job.spec.network.access_link.bandwidth)
    print(f"\n{args.workers} workers, {args.layers} layers of {args.layer_kbytes} kB, "
          f"forward {args.fwd_ms:g} ms/layer, backward 2x, links {args.rate}; "
          f"medians of {args.rounds} rounds")
    print(f"{'':>12} {'testbed ms':>11} {'simulator ms':>13} {'testbed/sim':>12}")
    for name, value in (("fair", fair), ("cadentflow", cadent)):
        print(f"{name:>12} {value * 1e3:>11.1f} {sim[name] * 1e3:>13.1f} "
              f"{value / sim[name]:>12.3f}")
    print(f"{'ratio':>12} {cadent / fair:>11.3f} {sim['cadentflow'] / sim['fair']:>13.3f}"
          "   (cadentflow / fair iteration time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
