"""`tailcut simulate`: run the paper's Fig. 2-4 experiments in the flow-level simulator."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tailcut.errors import SpecError
from tailcut.simulate import architectures
from tailcut.spec import units

DEFAULT_MODELS = ["resnet-50", "vgg-16", "inception-v3", "mlp"]


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("simulate", help="flow-level simulation of fair / coflow / cadentflow "
                       "at scales beyond this machine (the paper's Fig. 2-4)")
    p.add_argument("--models", nargs="+", default=DEFAULT_MODELS,
                   help=f"architectures (default: {' '.join(DEFAULT_MODELS)})")
    p.add_argument("--workers", nargs="+", type=int, default=[8, 16],
                   help="workers (and as many PS) per job (default: 8 16)")
    p.add_argument("--bandwidth", nargs="+", default=["1Gbit", "10Gbit"],
                   help="NIC rate, tc style (default: 1Gbit 10Gbit)")
    p.add_argument("--compute-scale", nargs="+", type=float, default=[1.0, 0.1],
                   help="multiply compute times (1 = K80 as in the paper; 0.1 = a 10x "
                        "faster accelerator; default: 1 0.1)")
    p.add_argument("--no-shared", action="store_true", help="skip the two-job Fig. 4 case")
    p.add_argument("--no-inference", action="store_true", help="skip the Fig. 3 case")
    p.add_argument("--headroom", choices=("quick", "full"),
                   help="also sweep where CadentFlow can beat ordered TCP: placements, "
                        "models and compute scales, each with the baseline's distance from "
                        "its floors (its own models and scales, not --models and "
                        "--compute-scale; quick: a few seconds, full: about 2 minutes of "
                        "CPU); headroom.csv, .txt and .png")
    p.add_argument("--headroom-only", action="store_true",
                   help="with --headroom: skip Fig. 1-4")
    p.add_argument("--processes", type=int, default=1,
                   help="run the headroom sweep's settings in this many processes (default 1)")
    p.add_argument("--results-dir", type=Path,
                   help="where to write tables (default: results/simulate-<time>)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tailcut.simulate import experiments

    bandwidths = []
    for text in args.bandwidth:
        try:
            bandwidths.append(units.parse_bandwidth(text))
        except ValueError as err:
            raise SpecError(f"--bandwidth {text}: {err}") from err
    for n in args.workers:
        if n < 1:
            raise SpecError(f"--workers {n}: must be >= 1")
    for factor in args.compute_scale:
        if factor <= 0:
            raise SpecError(f"--compute-scale {factor:g}: must be > 0")
    for name in args.models:
        try:
            architectures.get(name)
        except ValueError as err:
            raise SpecError(f"--models: {err}") from err
    out = args.results_dir or Path("results") / f"simulate-{time.strftime('%Y%m%d-%H%M%S')}"
    started = time.perf_counter()
    if args.headroom_only:
        if not args.headroom:
            raise SpecError("--headroom-only: give --headroom quick or --headroom full")
        return _headroom(args.headroom, out, started, args.processes)
    print("Fig. 1: the toy example, completion time of node C's three computations")
    toy = experiments.toy()
    experiments.write(toy, out, "fig1-toy", text=False)
    print("\n".join(f"  {r['variant']:<20} {r['completion_s']:.3f} s" for r in toy) + "\n")
    print("Fig. 2: training, iteration time relative to TCP (ordered connections)")
    rows = experiments.single_app(args.models, args.workers, bandwidths, args.compute_scale)
    experiments.write(rows, out, "fig2-training")
    print(experiments.format_table(rows))
    if not args.no_inference:
        print(f"\nFig. 3: inference, {max(args.workers)} agents and PS")
        rows = experiments.single_app(args.models, [max(args.workers)], bandwidths,
                                      args.compute_scale, inference=True)
        experiments.write(rows, out, "fig3-inference")
        print(experiments.format_table(rows))
    if not args.no_shared:
        print("\nFig. 4: two jobs sharing a rack uplink, slowest job's iteration time "
              "relative to one job alone under deadline CadentFlow")
        rows = experiments.shared_link(args.models, max(bandwidths), args.compute_scale)
        experiments.write(rows, out, "fig4-shared")
        print(experiments.format_table(rows))
    if args.headroom:
        print()
        _headroom(args.headroom, out, started, args.processes)
    print("\nThe paper's headline figures (from its text):")
    print(experiments.format_headlines())
    print(f"\nsimulated in {time.perf_counter() - started:.1f} s; tables in {out}/")
    return 0


def _headroom(grid: str, out: Path, started: float, processes: int) -> int:
    from tailcut.simulate import headroom

    if processes < 1:
        raise SpecError(f"--processes {processes}: must be >= 1")
    points = headroom.settings(grid)
    print(f"Headroom: {len(points)} settings, CadentFlow against ordered TCP (the paper's "
          f"baseline) and random-order TCP, each with its floors")
    rows = headroom.sweep(points, processes=processes)
    headroom.write(rows, out)
    print(headroom.format_table(rows))
    print("\n" + "\n".join(headroom.summary(rows)))
    print(f"\nsimulated in {time.perf_counter() - started:.1f} s "
          f"({time.process_time():.1f} s of CPU in this process); tables and headroom.png "
          f"in {out}/")
    return 0
