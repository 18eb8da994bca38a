"""`tailcut reproduce PAPER|all`: the command line."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from tailcut.papers import NAMES


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser(
        "reproduce", help="run what reproduces a paper's headline results and write a "
                          "report next to the paper's numbers")
    p.add_argument("paper", choices=(*NAMES, "all"),
                   help="apnet19 (bounded-loss transport), cadentflow, imc20 (PS RPC "
                        "latency), mlfabric, or all four")
    p.add_argument("--quick", action="store_true",
                   help="a smoke version in about 5 minutes (fewer models, seeds, epochs); "
                        "its numbers are not for citing")
    p.add_argument("--results-dir", type=Path,
                   help="where reports and raw data go (default: results/reproduce, or "
                        "results/reproduce-quick with --quick); a second run into the same "
                        "directory reuses the steps that finished")
    p.add_argument("--fresh", action="store_true",
                   help="run every step again instead of reusing finished ones")
    p.set_defaults(handler=_reproduce)


def _reproduce(args: argparse.Namespace) -> int:
    from tailcut.reproduce import run
    names = list(NAMES) if args.paper == "all" else [args.paper]
    out = args.results_dir or Path("results") / ("reproduce-quick" if args.quick
                                                 else "reproduce")
    words = ["reproduce", args.paper, *(["--quick"] if args.quick else []),
             *(["--results-dir", str(args.results_dir)] if args.results_dir else [])]
    invocation = "tailcut " + shlex.join(words)
    outcomes = run.reproduce(names, out.resolve(), args.quick, args.fresh, invocation,
                             progress=lambda line: print(line, flush=True))
    failed = [o for o in outcomes if o.failed_steps]
    print("\nreports: " + ", ".join(str(o.report) for o in outcomes))
    return 1 if failed else 0
