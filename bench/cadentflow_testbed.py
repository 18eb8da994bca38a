"""CadentFlow on the testbed: iteration time under TCP fair share, coflow (Varys' MADD)
and priority classes, measured side by side, and the simulator's prediction for the
same case.

    sudo .venv/bin/python bench/cadentflow_testbed.py [--rounds 5] [--workers 2]
    sudo .venv/bin/python bench/cadentflow_testbed.py --layer-kbytes 250,500,1000,2000

Builds a real job network (1 PS + n workers on one rack, access links shaped by HTB to
--rate), then alternates rounds of `fair` (every tensor its own TCP flow, default
class), `coflow` (the same flows, each sender paced by SO_MAX_PACING_RATE at its MADD
rate, recomputed as flows start and end; a pull is one coflow, a push another) and
`cadentflow` (the same flows tagged per layer, HTB priority classes and the DSCP
classifier on every pod) and reports medians. Compute is emulated per layer
(tailcut.scheduling.exchange). The same model, link rate and placement run in the
flow-level simulator (fair = per-tensor TCP, coflow = MADD, cadentflow = priority), at
the TCP goodput of the link (1448 payload bytes per 1514-byte frame). --policies
picks a subset. Each round's verdict is judged from the host's CPU over it
(bench/hostcheck.py: its links are not sampled); each policy/fair is marked with both
policies' verdicts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import hostcheck  # noqa: E402
from tailcut import spec  # noqa: E402
from tailcut.net import build, topology  # noqa: E402
from tailcut.scheduling import enforce, exchange, madd, tags  # noqa: E402
from tailcut.simulate import architectures, engine  # noqa: E402
from tailcut.simulate import topology as simtopo  # noqa: E402

GOODPUT = 1448 / 1514


POLICIES = ("fair", "coflow", "cadentflow")


def model(layers: int, layer_bytes: list[int], fwd_s: float) -> list[exchange.LayerLoad]:
    """`layers` tensors; sizes cycle through `layer_bytes` (one value: all equal)."""
    return [exchange.LayerLoad(f"l{k}", layer_bytes[k % len(layer_bytes)], fwd_s, 2 * fwd_s)
            for k in range(layers)]


def simulate(loads: list[exchange.LayerLoad], workers: int, rate_bit: float) -> dict[str, float]:
    """The same case in the simulator (one priority level per layer: run with
    --layers <= 4 so the testbed has a class per layer too)."""
    layers = tuple(architectures.Layer(l.name, l.bytes // 4, 1, l.fwd_s, l.bwd_s)
                   for l in loads)
    arch = architectures.Architecture("testbed", layers, 1, "bench")
    out = {}
    for name, policy, tcp in (("fair", "fair", "per-tensor"), ("coflow", "coflow", "ordered"),
                              ("cadentflow", "cadentflow", "ordered")):
        fabric = simtopo.star(1 + workers, rate_bit * GOODPUT)
        job = engine.Job("t", arch, list(range(1, 1 + workers)), [0])
        sim = engine.Simulation(fabric, [job], policy, tcp=tcp)  # type: ignore[arg-type]
        out[name] = sim.run().mean_iteration_s()
    # The testbed paces a coflow at madd.HEADROOM of the links' goodput: the same
    # case with the links that much slower says what the headroom costs.
    fabric = simtopo.star(1 + workers, rate_bit * GOODPUT * madd.HEADROOM)
    job = engine.Job("t", arch, list(range(1, 1 + workers)), [0])
    out["coflow@headroom"] = engine.Simulation(fabric, [job], "coflow").run().mean_iteration_s()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=3, help="per round")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--layer-kbytes", default="1000",
                        help="size of each layer; a comma list cycles over the layers")
    parser.add_argument("--fwd-ms", type=float, default=100.0, help="forward time per layer")
    parser.add_argument("--rate", default="100Mbit")
    parser.add_argument("--policies", default=",".join(POLICIES))
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    policies = [p for p in POLICIES if p in args.policies.split(",")]
    sizes = [int(float(v) * 1000) for v in args.layer_kbytes.split(",")]
    if os.geteuid() != 0:
        print("needs root (it builds network namespaces)", file=sys.stderr)
        return 2
    watch = hostcheck.before(args)
    levels = min(args.layers, 4)
    job = spec.from_dict({
        "apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": f"cf-bench-{os.getpid()}"},
        "spec": {"replicas": {"workers": args.workers},
                 "network": {"accessLink": {"bandwidth": args.rate},
                             "uplink": {"bandwidth": args.rate}},
                 "scheduling": {"policy": "cadentflow", "priorityLevels": levels}}})
    loads = model(args.layers, sizes, args.fwd_ms / 1000)
    # The job's tags: derived from the model by the spec's rules (one connection per
    # tensor carries its pull and its push, so it takes the pull's level).
    resolved = tags.resolve(job.spec.scheduling, [l.name for l in loads],
                            [l.fwd_s for l in loads])
    level_by_layer = [int(resolved[(l.name, "pull")].priority or 0) for l in loads]
    topo = topology.plan(job)
    network = build.build(topo, has_netem=False)
    times: dict[str, list[float]] = {p: [] for p in policies}
    verdicts: dict[str, list[str]] = {p: [] for p in policies}
    counts = None
    try:
        for r in range(args.rounds):
            for i, policy in enumerate(policies):
                handle = None
                if policy == "cadentflow":
                    handle = enforce.apply(topo, job.spec.scheduling)
                run_watch = hostcheck.Watch()
                try:
                    its = exchange.run(topo, loads, args.iterations,
                                       tagged=policy == "cadentflow", levels=levels,
                                       port=exchange.PORT + len(policies) * r + i,
                                       level_by_layer=level_by_layer,
                                       paced=policy == "coflow")
                finally:
                    if handle is not None:
                        counts = handle.counts()
                        handle.detach()
                fidelity = hostcheck.judged(run_watch.stop())
                verdicts[policy].append(hostcheck.verdict_of(fidelity))
                median = statistics.median(i.seconds for i in its)
                times[policy].append(median)
                print(f"round {r}: {policy:>10} iteration {median * 1e3:7.1f} ms "
                      f"(median of {args.iterations}); {hostcheck.during(fidelity)}",
                      flush=True)
        if counts is not None:
            ps_counts = counts[f"{topo.pod('ps-0').netns}/eth0"]
            print("PS egress packets per class in the last cadentflow round: " + ", ".join(
                f"{'default' if k is None else f'level {k}'} {v[0]}"
                for k, v in ps_counts.items() if v[0]))
    finally:
        network.destroy()
    median = {p: statistics.median(times[p]) for p in policies}
    sim = simulate(loads, args.workers, job.spec.network.access_link.bandwidth)
    print(f"\n{args.workers} workers, {args.layers} layers of {args.layer_kbytes} kB, "
          f"forward {args.fwd_ms:g} ms/layer, backward 2x, links {args.rate}; "
          f"medians of {args.rounds} rounds")
    print(f"{'':>12} {'testbed ms':>11} {'simulator ms':>13} {'testbed/sim':>12}")
    for name in policies:
        print(f"{name:>12} {median[name] * 1e3:>11.1f} {sim[name] * 1e3:>13.1f} "
              f"{median[name] / sim[name]:>12.3f}")
    if "coflow" in median:
        h = sim["coflow@headroom"]
        print(f"{'(coflow':>12} {'':>11} {h * 1e3:>13.1f} {median['coflow'] / h:>12.3f}"
              f"   simulated at the {madd.HEADROOM:g} pacing headroom)")
    for name in policies:
        if name != "fair" and "fair" in median:
            print(f"{name + '/fair':>16} {median[name] / median['fair']:>7.3f} "
                  f"{sim[name] / sim['fair']:>13.3f}   (iteration time relative to fair) "
                  + hostcheck.mark({p: verdicts[p] for p in (name, "fair")}))
    hostcheck.after(watch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
