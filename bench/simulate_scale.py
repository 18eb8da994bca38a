"""Cost of the flow-level simulator as workers grow: one training iteration on a star,
every policy, medians of 3 runs.

    .venv/bin/python bench/simulate_scale.py [--max-workers 256] [--repeats 3]

Two series: (a) about 1,000 flows per iteration whatever the worker count (layers =
1000 / (2 x workers), at least 2); (b) ResNet-50's 54 layers on 16 PS, so flows grow
with workers (2 x 54 x workers). Identical workers finish their messages at the same
instants, which the event loop handles in one event, so each series also runs with
every worker's compute slowed by a random 0-20% (`jitter`): then nearly every message
ends at its own instant, the expensive case. The target: 256 workers and 1,000 flows
per iteration in < 60 s.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import hostcheck  # noqa: E402
from tailcut.simulate import architectures, engine, topology  # noqa: E402

GBIT = 1e9


def toy(layers: int) -> architectures.Architecture:
    shape = tuple(architectures.Layer(f"l{i}", 250_000 * (1 + i % 4), 1, 1e-3, 2e-3)
                  for i in range(layers))
    return architectures.Architecture(f"toy-{layers}", shape, 32, "bench")


def once(arch: architectures.Architecture, workers: int, ps: int, policy: str,
         jitter: float) -> tuple[float, int, int]:
    fabric = topology.star(workers + ps, 10 * GBIT)
    rng = random.Random(workers)
    slow = [1 + jitter * rng.random() for _ in range(workers)] if jitter else None
    job = engine.Job("bench", arch, list(range(workers)), list(range(workers, workers + ps)),
                     worker_slowdown=slow)
    start = time.perf_counter()
    result = engine.Simulation(fabric, [job], policy).run()
    return time.perf_counter() - start, len(result.flows), result.events


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-workers", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--resnet-jitter-max", type=int, default=64,
                        help="largest worker count of the ResNet-50 series with jitter "
                             "(its cost grows about quadratically: 24 s at 64 workers)")
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    watch = hostcheck.before(args)
    counts = [w for w in (16, 32, 64, 128, 256, 512, 1024) if w <= args.max_workers]
    print(f"{'series':>10} {'jitter':>6} {'workers':>7} {'PS':>3} {'flows':>6} {'policy':>10} "
          f"{'events':>7} {'median s':>9} {'min s':>7}")
    for series, jitter in (("1k-flows", 0.0), ("1k-flows", 0.2), ("resnet-50", 0.0),
                           ("resnet-50", 0.2)):
        for workers in counts:
            if series == "resnet-50" and jitter and workers > args.resnet_jitter_max:
                continue
            if series == "1k-flows":
                arch, ps = toy(max(2, round(1000 / (2 * workers)))), 1
            else:
                arch, ps = architectures.resnet50(), 16
            for policy in engine.POLICIES:
                runs = [once(arch, workers, ps, policy, jitter) for _ in range(args.repeats)]
                times = [r[0] for r in runs]
                print(f"{series:>10} {jitter:>6g} {workers:>7} {ps:>3} {runs[0][1]:>6} {policy:>10} "
                      f"{runs[0][2]:>7} {statistics.median(times):>9.2f} {min(times):>7.2f}",
                      flush=True)
    hostcheck.after(watch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
