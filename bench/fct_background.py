"""FCT of training messages with and without background load, for one transport.

Runs the quickstart twice on this host with the same transport: once alone, once
under a Locust background load (web-search flows from rack-1 into the PS's pod,
crossing rack-1's uplink and the PS's access link, as the workers' gradients do) at
the given load factor of rack-1's uplink. Prints median/p90/p99 completion time of the
PUSH (gradient) and PARAMS (model) messages side by side and plots their CDFs; each
run's fidelity verdict, and the with/without ratios marked with both (bench/README.md).
Each run gets a fresh results directory (by default under results/ with the time in
its name: a directory that holds a run is refused).

    .venv/bin/python bench/fct_background.py --transport tcp [--load-factor 0.5]
        [--job examples/quickstart.yaml] [--out results/fct-background-tcp-TIME]
    .venv/bin/python bench/fct_background.py --transport bounded-loss [--p 0.9]
"""

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import hostcheck  # noqa: E402
from tailcut import spec  # noqa: E402
from tailcut.runtime import local  # noqa: E402


P_TRANSPORTS = ("bounded-loss", "app-drop")   # the ones whose spec needs p


def background_section(load_factor: float) -> dict[str, Any]:
    return {"senders": ["rack-1"], "receivers": ["ps-0"],
            "target": {"link": "uplink/rack-1", "loadFactor": load_factor},
            "flowSizes": {"distribution": "web-search"}, "warmupS": 3}


def completions(results: Path) -> dict[str, list[float]]:
    """Completion times (s) of PUSH messages (at the PS) and PARAMS (at the workers)."""
    out: dict[str, list[float]] = {"PUSH": [], "PARAMS": []}
    for path in results.glob("messages*.csv"):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row["kind"] in out:
                    out[row["kind"]].append(float(row["completion_s"]))
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", default="tcp")
    parser.add_argument("--load-factor", type=float, default=0.5)
    parser.add_argument("--job", default="examples/quickstart.yaml")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--p", type=float, default=0.9,
                        help="fraction of every message delivered, for transports with p "
                             "(bounded-loss, app-drop)")
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    watch = hostcheck.before(args)
    out = args.out or Path("results") / time.strftime(f"fct-background-{args.transport}-"
                                                      "%Y%m%dT%H%M%S", time.gmtime())
    base = yaml.safe_load(Path(args.job).read_text())
    base["spec"].setdefault("transport", {})["type"] = args.transport
    if args.transport in P_TRANSPORTS:
        base["spec"]["transport"]["p"] = args.p
    runs: dict[str, dict[str, list[float]]] = {}
    verdicts: dict[str, list[str]] = {}
    for label, bg in (("no background", None),
                      (f"background load {args.load_factor:g}", background_section(args.load_factor))):
        doc = yaml.safe_load(yaml.safe_dump(base))
        doc["metadata"]["name"] = "bg-fct"
        if bg is not None:
            doc["spec"]["backgroundLoad"] = bg
        job = spec.from_dict(doc, args.job)
        results = out / ("background" if bg else "alone")
        result = local.run(job, results, progress=lambda line: None)
        runs[label] = completions(results)
        verdicts[label] = [hostcheck.verdict_of(result.fidelity)]
        extra = ""
        if bg is not None:
            summary = yaml.safe_load((results / "background" / "background.json").read_text())
            extra = (f", measured load factor {summary['measured_load_factor']:.3f} on "
                     f"{summary['target_link']} (link total, training included)")
        print(f"{label}: JCT {result.jct_s:.1f} s, {result.epochs} epochs, accuracy "
              f"{result.final_accuracy:.3f}{extra}; {hostcheck.during(result.fidelity)}",
              flush=True)
    print(f"\ntransport {args.transport}: message completion time, ms")
    print(f"{'':28} {'kind':>7} {'count':>6} {'median':>8} {'p90':>8} {'p99':>8}")
    for label, data in runs.items():
        for kind, values in data.items():
            if values:
                print(f"{label:28} {kind:>7} {len(values):>6} "
                      f"{statistics.median(values) * 1e3:>8.2f} {pct(values, 0.9) * 1e3:>8.2f} "
                      f"{pct(values, 0.99) * 1e3:>8.2f}")
    labels = list(runs)
    for kind in ("PUSH", "PARAMS"):
        a, b = runs[labels[0]][kind], runs[labels[1]][kind]
        if a and b:
            print(f"{kind}: median with/without background = "
                  f"{statistics.median(b) / statistics.median(a):.2f}x, p99 "
                  f"{pct(b, 0.99) / pct(a, 0.99):.2f}x {hostcheck.mark(verdicts)}")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, kind, what in zip(axes, ("PUSH", "PARAMS"),
                              ("gradients, worker -> PS", "model, PS -> worker")):
        for label, style in zip(labels, ("-", "--")):
            values = sorted(runs[label][kind])
            if values:
                ax.plot([v * 1e3 for v in values],
                        [(i + 1) / len(values) for i in range(len(values))],
                        style, label=f"{label} (n={len(values)})")
        ax.set_xscale("log")
        ax.set_xlabel("message completion time (ms)")
        ax.set_ylabel("CDF")
        ax.set_title(f"{kind}: {what}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right")
    name = args.transport + (f" (p={args.p:g})" if args.transport in P_TRANSPORTS else "")
    fig.suptitle(f"quickstart over {name}: training message FCT with and without "
                 f"background load {args.load_factor:g} on uplink rack-1")
    fig.tight_layout()
    png = out / f"fct-cdf-{args.transport}.png"
    fig.savefig(png, dpi=110)
    print(f"plot: {png}")
    hostcheck.after(watch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
