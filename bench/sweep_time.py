"""How long a full loss-tolerance sweep of one model takes, against the 10-minute budget.

    .venv/bin/python bench/sweep_time.py [--model mlp] [--runs 3] [--repeats 1] [--jobs N]

Runs ``tailcut sweep``'s sweep (p = 0, 0.05, ... until training stops converging,
``--runs`` seeds per p) ``--repeats`` times and prints each wall time, the median,
and its ratio to 600 s. Other processes on the machine slow it down: run it on an
idle machine for a number to quote, and look at the per-run emulation times it
prints to see how much of the time was training.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # as the roles and `tailcut sweep`: before numpy loads

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import hostcheck  # noqa: E402
from tailcut.ml import models  # noqa: E402
from tailcut.training import sweep  # noqa: E402

BUDGET_S = 600.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", choices=models.names())
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=None)
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    watch = hostcheck.before(args)
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    times = []
    for repeat in range(args.repeats):
        started = time.perf_counter()
        result = sweep.sweep(args.model, runs=args.runs, jobs=args.jobs)
        took = time.perf_counter() - started
        times.append(took)
        runs = [r.wall_s for pt in result.points for r in pt.runs]
        print(f"repeat {repeat + 1}: {took:.1f} s for {len(result.points)} loss rates "
              f"(0 .. {result.points[-1].loss_rate:.2f}), {len(runs)} runs, median run "
              f"{statistics.median(runs):.2f} s; x1 = {result.x1}, x2 = {result.x2}")
    median = statistics.median(times)
    print(f"{args.model}: full sweep median {median:.1f} s over {len(times)} repeat(s); "
          f"ratio to the {BUDGET_S:.0f} s budget: {median / BUDGET_S:.2f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
