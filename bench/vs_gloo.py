"""The torch MLP by DDP/Gloo against a PS over tcp and over bounded-loss, three conditions.

    .venv/bin/python bench/vs_gloo.py [--runs 3] [--conditions clean loss-1% ...]
        [--model torch-mlp] [--bandwidth RATE] [--mtu BYTES] [--json FILE]

Each run is the quickstart network (4 workers in 2 racks, 1 Gbit/s, or every link at
--bandwidth) training the torch MLP (model torch-mlp: the quickstart MLP as an
nn.Module, from the same initial parameters) to 93% test accuracy, through `tailcut
run`'s local runtime, by

  gloo        syncMode allreduce: no PS, PyTorch DDP with Gloo's ring all-reduce
  ps-tcp      a PS, bsp, over tcp
  ps-bl       a PS, bsp, over bounded-loss p=0.9
  ar-bl       syncMode allreduce over bounded-loss p=0.9: no PS, tailcut's transpose
              all-reduce (tailcut.training.transpose)

interleaved run by run (gloo, ps-tcp, ps-bl, gloo, ...), in each condition:

  clean                examples/quickstart.yaml's links
  loss-1%              1% random loss on every access link (the BPF coin flip)
  background-shallow   Locust at load 0.5 on rack-1's uplink, flows from a background
                       server in rack-1 to worker-0's pod (the same traffic for all
                       three: the PS jobs' ps-0 is no pod of the allreduce job), and
                       85 KB switch buffers (bench/bl_conditions.py's shallow ports)

Columns per condition and mode (medians): time to the target accuracy (the first
epoch at or above it, from epochs.csv; the JCT when it converged), per-iteration p50
and p99 over every worker's iterations (gloo, ar-bl: allreduce-worker-<i>.csv; a PS job:
the gap between a worker's successive pulls, from rpc-client-worker-<i>.csv: both
are one worker's whole step, compute and communication), and the final accuracy.
Then the issue's goals, side by side: gloo / ps-bl and gloo / ar-bl time to target (>= 1.3 where
gloo's p99 is >= 3x its p50) and ps-bl within 10% of gloo on the clean network.
Each ratio is marked with both modes' fidelity verdicts: a goal counts only where it
says "met" (every run of both network-bound; bench/README.md).
Root; torch (scripts/setup.sh).
"""

import argparse
import csv
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import hostcheck  # noqa: E402
from tailcut import spec  # noqa: E402
from tailcut.runtime import local  # noqa: E402

SHALLOW = {"bufferBytes": 85_000}
MODES = {"gloo": ("allreduce", {"type": "tcp"}),
         "ps-tcp": ("bsp", {"type": "tcp"}),
         "ps-bl": ("bsp", {"type": "bounded-loss", "p": 0.9}),
         "ar-bl": ("allreduce", {"type": "bounded-loss", "p": 0.9})}
BOUNDED = ("ps-bl", "ar-bl")
BACKGROUND = {"senders": ["rack-1"], "receivers": ["worker-0"],
              "target": {"link": "uplink/rack-1", "loadFactor": 0.5},
              "flowSizes": {"distribution": "web-search"}, "shape": {"type": "constant"},
              "warmupS": 3}


def _clean(raw: dict[str, Any]) -> dict[str, Any]:
    return raw


def _lossy(raw: dict[str, Any]) -> dict[str, Any]:
    raw["spec"]["network"]["accessLink"]["loss"] = 0.01
    return raw


def _background_shallow(raw: dict[str, Any]) -> dict[str, Any]:
    for link in ("accessLink", "uplink"):
        raw["spec"]["network"][link].update(SHALLOW)
    raw["spec"]["backgroundLoad"] = json.loads(json.dumps(BACKGROUND))
    return raw


CONDITIONS = {"clean": _clean, "loss-1%": _lossy, "background-shallow": _background_shallow}


def job(condition: str, mode: str, model: str, bandwidth: str | None = None,
        mtu: int | None = None) -> spec.model.TrainingJob:
    raw = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    raw = CONDITIONS[condition](raw)
    if bandwidth:
        for link in ("accessLink", "uplink"):
            raw["spec"]["network"][link]["bandwidth"] = bandwidth
    if mtu:
        raw["spec"]["network"]["mtu"] = mtu
    sync, transport = MODES[mode]
    raw["metadata"]["name"] = f"vsg-{mode}"
    raw["spec"]["training"].update(model=model, syncMode=sync)
    raw["spec"]["transport"] = transport
    if sync == "allreduce":   # no PS pod to place
        raw["spec"]["network"]["placement"].pop("ps-0")
    return spec.from_dict(raw)


def _iteration_ms(results: Path, mode: str, workers: int) -> np.ndarray:
    """Every worker's step times (ms)."""
    out: list[float] = []
    for w in range(workers):
        if MODES[mode][0] == "allreduce":
            with open(results / f"allreduce-worker-{w}.csv", newline="") as f:
                out += [float(r["iteration_ms"]) for r in csv.DictReader(f)]
            continue
        with open(results / f"rpc-client-worker-{w}.csv", newline="") as f:
            pulls = {int(r["step"]): int(r["done_ns"]) for r in csv.DictReader(f)
                     if r["op"] == "pull" and r["server"] == "ps-0"}
        steps = sorted(pulls)
        out += [(pulls[b] - pulls[a]) / 1e6 for a, b in zip(steps, steps[1:]) if b == a + 1]
    return np.array(out)


def _time_to_target(results: Path, target: float) -> float:
    with open(results / "epochs.csv", newline="") as f:
        for row in csv.DictReader(f):
            if float(row["test_accuracy"]) >= target:
                return float(row["elapsed_s"])
    return float("nan")


def one(condition: str, mode: str, model: str, bandwidth: str | None,
        mtu: int | None) -> dict[str, Any]:
    j = job(condition, mode, model, bandwidth, mtu)
    with tempfile.TemporaryDirectory(prefix="vsg-") as out:
        r = local.run(j, Path(out), progress=lambda line: None)
        its = _iteration_ms(Path(out), mode, j.spec.replicas.workers)
        ttt = _time_to_target(Path(out), j.spec.training.target_accuracy or 1.0)
    return {"time_to_target_s": ttt, "jct_s": r.jct_s, "accuracy": r.final_accuracy,
            "converged": r.converged, "p50_ms": float(np.percentile(its, 50)),
            "p99_ms": float(np.percentile(its, 99)), "iterations": r.iterations,
            "retrans": r.tcp_retrans_segs or 0, "rtos": r.tcp_rto_timeouts or 0,
            **hostcheck.columns(r.fidelity), "during": hostcheck.during(r.fidelity)}


def load() -> str:
    return open("/proc/loadavg").read().split()[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--conditions", nargs="+", choices=list(CONDITIONS),
                    default=list(CONDITIONS))
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--model", default="torch-mlp", choices=["torch-mlp", "torch-cnn"])
    ap.add_argument("--bandwidth", metavar="RATE",
                    help="every link's bandwidth (e.g. 200Mbit: where the network, not "
                         "the CPU of 2 cores, bounds the step); unset: the example's 1Gbit")
    ap.add_argument("--mtu", type=int, help="the network's MTU for every mode (e.g. 9000: "
                    "jumbo frames, as many ML clusters run); unset: the example's 1500")
    ap.add_argument("--json", type=Path, help="also write every run's figures here")
    hostcheck.add_arguments(ap)
    args = ap.parse_args()
    watch = hostcheck.before(args)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        c: {m: [] for m in args.modes} for c in args.conditions}
    loads = []
    for run in range(args.runs):
        for c in args.conditions:
            for m in args.modes:
                started = time.monotonic()
                r = one(c, m, args.model, args.bandwidth, args.mtu)
                runs[c][m].append(r)
                loads.append(float(load()))
                print(f"run {run + 1}/{args.runs} {c:>18} {m:>6}: to target "
                      f"{r['time_to_target_s']:6.2f} s, JCT {r['jct_s']:6.2f} s, iteration "
                      f"p50 {r['p50_ms']:.1f} / p99 {r['p99_ms']:.1f} ms, accuracy "
                      f"{r['accuracy']:.4f}{'' if r['converged'] else ' (NOT reached)'}, "
                      f"tcp retrans {r['retrans']} / RTOs {r['rtos']} "
                      f"(wall {time.monotonic() - started:.0f} s, load {load()}); "
                      f"{r['during']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))

    def med(c: str, m: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[c][m])

    print(f"\n{args.model}, links at {args.bandwidth or '1Gbit'}, MTU {args.mtu or 1500}, "
          f"medians of {args.runs} "
          f"interleaved run(s); load average during the runs "
          f"{min(loads):.1f}-{max(loads):.1f} on {_cores()} cores:\n")
    print("| condition | mode | to target (s) | iteration p50 (ms) | p99 (ms) | p99 / p50 "
          "| accuracy | tcp retrans / RTOs |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for c in args.conditions:
        for m in args.modes:
            p50, p99 = med(c, m, "p50_ms"), med(c, m, "p99_ms")
            print(f"| {c} | {m} | {med(c, m, 'time_to_target_s'):.2f} | {p50:.1f} "
                  f"| {p99:.1f} | {p99 / p50:.1f} | {med(c, m, 'accuracy'):.4f} "
                  f"| {med(c, m, 'retrans'):.0f} / {med(c, m, 'rtos'):.0f} |")
    for bl in (m for m in BOUNDED if m in args.modes and "gloo" in args.modes):
        print(f"\n| condition | gloo / {bl} time to target | gloo p99 / p50 | goal "
              "| verdicts |")
        print("|---|---:|---:|---|---|")
        for c in args.conditions:
            ratio = med(c, "gloo", "time_to_target_s") / med(c, bl, "time_to_target_s")
            tail = med(c, "gloo", "p99_ms") / med(c, "gloo", "p50_ms")
            goal = (">= 1.3 (gloo's tail >= 3x)" if tail >= 3
                    else ">= 0.91 (within 10%)" if c == "clean" else "-")
            marked = hostcheck.mark({m: [r["verdict"] for r in runs[c][m]]
                                     for m in ("gloo", bl)})
            print(f"| {c} | **{ratio:.2f}** | {tail:.1f} | {goal} | {marked} |")
    hostcheck.after(watch)


def _cores() -> int:
    import os
    return os.cpu_count() or 0


if __name__ == "__main__":
    main()
