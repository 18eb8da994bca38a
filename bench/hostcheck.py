"""Whether a bench measured the network or the host: the host checked before the runs,
each run's fidelity verdict beside its figures, and a ratio of two runs marked.

Why: the same bench gave tcp / bounded-loss 0.48 on one host and 1.07 on another, and
a cell swung 1.6x between two runs minutes apart on one host (issue 41). A ratio says
something about the network only when both of its runs were bound by the network,
so every bench:

- refuses to start when other processes already take more of the cores than a
  network-bound run allows (`before`; verdict.THRESHOLDS["others_cpu"]'s margin),
  unless `--allow-busy`;
- prints and records each run's verdict with the host's CPU, load and the other
  processes' share during it (`during`, `columns`: from the run's fidelity; a run
  outside tailcut's runtime gets one judged from a `Watch` over it, `judged`), and
  the host over all its runs (`after`);
- marks every ratio of two runs with both runs' verdicts, and calls it "met" only
  when every run on both sides was network-bound (`mark`).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from typing import Any, Iterable, Mapping, Optional

from tailcut.fidelity import hostcpu, processes, verdict

# other processes' share of all cores from which a run is marginal at best
BUSY_SHARE = verdict.THRESHOLDS["others_cpu"][0]
UNMEASURED = "unmeasured"     # a run without a verdict (e.g. on Kubernetes)
MET = "met"
ORDER = (verdict.NETWORK_BOUND, verdict.MARGINAL, verdict.HOST_BOUND, UNMEASURED)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-busy", action="store_true",
                        help="run even when other processes take more than "
                             f"{BUSY_SHARE:.0%}% of the cores (its runs are then unlikely "
                             "to be network-bound)")


class Watch:
    """The host's CPU and other processes' CPU from construction to `stop`; the
    processes below this one (the bench's runs) are the job's, not the others'."""

    def __init__(self) -> None:
        self.before: Optional[dict[str, Any]] = None   # set by `before`
        self.tally = processes.Tally(roots={os.getpid()})
        self.tally.add(processes.read())
        self.start = hostcpu.read()

    def stop(self) -> dict[str, Any]:
        self.tally.add(processes.read())
        host = hostcpu.window(self.start, hostcpu.read())
        return {"host": host, "processes": self.tally.summary(host["wall_s"], host["cores"])}


def measure(seconds: float = 2.0) -> dict[str, Any]:
    watch = Watch()
    time.sleep(seconds)
    return watch.stop()


def describe(reading: Mapping[str, Any]) -> str:
    """One line: the host's busy share, load and the other processes' share."""
    host, procs = reading.get("host") or {}, reading.get("processes") or {}
    text = (f"host {host.get('busy', float('nan')):.0%} busy of {host.get('cores')} cores, "
            f"load {host.get('load1', float('nan')):.2f}")
    if procs:
        text += f", other processes {procs['share']['others']:.0%} ({_busiest(procs)})"
    return text


def _busiest(procs: Mapping[str, Any]) -> str:
    return ", ".join(f"{name} {s:.1f} s" for name, s in
                     (procs.get("busiest_others") or {}).items()) or "none named"


def refusal(reading: Mapping[str, Any]) -> Optional[str]:
    """Why a bench should not start on this reading of the host, or None."""
    share = reading["processes"]["share"]["others"]
    if share <= BUSY_SHARE:
        return None
    host = reading.get("host") or {}
    return (f"other processes take {share:.0%} of the cores "
            f"({_busiest(reading['processes'])}), "
            f"more than the {BUSY_SHARE:.0%} a network-bound run allows; the host is "
            f"{host.get('busy', float('nan')):.0%} busy, load {host.get('load1')}. Stop "
            "them, or pass --allow-busy to run anyway and read every run's verdict")


def before(args: argparse.Namespace, seconds: float = 2.0) -> Watch:
    """Measure the host for `seconds`, print it, exit 2 if it is busy (unless
    args.allow_busy); return a Watch over the runs that follow (its `before`: this
    reading)."""
    reading = measure(seconds)
    print(f"before the runs: {describe(reading)}", flush=True)
    problem = refusal(reading)
    if problem and not args.allow_busy:
        print(f"refused to start: {problem}", file=sys.stderr)
        sys.exit(2)
    if problem:
        print(f"busy host, going on (--allow-busy): {problem}", flush=True)
    watch = Watch()
    watch.before = reading
    return watch


def after(watch: Watch) -> dict[str, Any]:
    """Print and return the host over the runs since `before`."""
    reading = watch.stop()
    print(f"during the runs: {describe(reading)}", flush=True)
    return {"before": watch.before, "during": reading}


def judged(reading: Mapping[str, Any]) -> dict[str, Any]:
    """A verdict for a run outside tailcut's runtime (a bench's own roles, a
    micro-benchmark) from a Watch over it: the host's CPU and the other processes'
    only, its links not sampled (the verdict's notes say so)."""
    return verdict.judge(host=reading["host"], processes=reading["processes"])


def verdict_of(fidelity: Optional[Mapping[str, Any] | str]) -> str:
    """A run's verdict from its fidelity, or the verdict itself (a job's status may
    carry only that); UNMEASURED without one."""
    if isinstance(fidelity, str):
        return fidelity or UNMEASURED
    return (fidelity or {}).get("verdict") or UNMEASURED


def during(fidelity: Optional[Mapping[str, Any]]) -> str:
    """A run's verdict and the host during it, from its fidelity (metrics.json)."""
    evidence = (fidelity or {}).get("evidence") or {}
    if not evidence.get("host"):
        return verdict_of(fidelity)
    return f"{verdict_of(fidelity)} ({describe(evidence)})"


def columns(fidelity: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """A run's verdict and host figures, for a bench's CSV or JSON."""
    evidence = (fidelity or {}).get("evidence") or {}
    host, procs = evidence.get("host") or {}, evidence.get("processes") or {}
    return {"verdict": verdict_of(fidelity), "host_busy": host.get("busy"),
            "load1": host.get("load1"),
            "others_cpu": (procs.get("share") or {}).get("others")}


def mark(sides: Mapping[str, Iterable[Optional[str]]]) -> str:
    """A ratio's mark from each side's runs' verdicts: "met" only when every run of
    every side was network-bound, else each side's verdicts, e.g.
    "(tcp host-bound, bounded-loss 2 network-bound + 1 marginal)"."""
    said = {name: collections.Counter(v or UNMEASURED for v in runs)
            for name, runs in sides.items()}
    if all(set(counts) == {verdict.NETWORK_BOUND} for counts in said.values()):
        return MET
    return "(" + ", ".join(f"{name} {_side(counts)}" for name, counts in said.items()) + ")"


def counted(verdicts: Iterable[Optional[str]]) -> str:
    """Runs' verdicts in a few words, e.g. "2 network-bound + 1 marginal"."""
    return _side(collections.Counter(v or UNMEASURED for v in verdicts))


def _side(counts: collections.Counter[str]) -> str:
    if not counts:
        return "no runs"
    if len(counts) == 1:
        return next(iter(counts))
    known = sorted(counts, key=lambda v: ORDER.index(v) if v in ORDER else len(ORDER))
    return " + ".join(f"{counts[v]} {v}" for v in known)
