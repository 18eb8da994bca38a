"""The iteration in the network, side by side in one run: the PS alone, in-network
aggregation, multicast of the parameters, and both.

    sudo .venv/bin/python bench/innet_agg.py [--repeats 3] [--epochs 2] [--loss 0.01]
                                             [--bandwidth 200Mbit]

examples/in-network-whole-iteration.yaml: the sparse click model with Zipf-skewed ids,
1 PS in a rack of its own and 8 workers in two racks of four, 1 Gbit/s links, over tcp,
for a fixed number of epochs (no accuracy target, so every variant does the same work).
Each repeat runs the four variants with the same seed (seeds 0, 1, ...), interleaved.
Prints per run and as medians: the bytes the PS's link received and sent per iteration
(its veth's counters), the median iteration time (metrics.json), JCT, final test
accuracy, the slots the PS had to flush and the contributions that never made a sum
(aggregation), and the slots the workers had repaired (multicast). --loss puts that
loss on every access link (both directions). --bandwidth sets every link's rate: on a
host whose cores cannot keep eight workers' iterations at the link's pace (two cores at
1 Gbit/s: docs/in-network.md), a lower rate puts the bottleneck back in the network,
where the papers' testbeds have it. Each run prints its fidelity verdict, and each
none/variant ratio is marked with both variants' verdicts (bench/README.md). Root."""

import argparse
import csv
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import hostcheck  # noqa: E402
from tailcut import spec  # noqa: E402
from tailcut.runtime import local  # noqa: E402

VARIANTS = {"none": {}, "agg": {"aggregate": True}, "mcast": {"multicast": True},
            "agg+mcast": {"aggregate": True, "multicast": True}}


def job(variant: str, seed: int, epochs: int, loss: float,
        bandwidth: str | None = None) -> spec.model.TrainingJob:
    raw = yaml.safe_load((ROOT / "examples" / "in-network-whole-iteration.yaml").read_text())
    raw["metadata"]["name"] = f"innet-bench-{variant.replace('+', '-')}"
    training = raw["spec"]["training"]
    training.pop("targetAccuracy")
    training.update(epochs=epochs, seed=seed)
    if loss:
        raw["spec"]["network"]["accessLink"]["loss"] = loss
    if bandwidth:
        raw["spec"]["network"]["accessLink"]["bandwidth"] = bandwidth
        raw["spec"]["network"]["uplink"]["bandwidth"] = bandwidth
    if VARIANTS[variant]:
        raw["spec"]["network"]["inNetwork"] = VARIANTS[variant]
    else:
        del raw["spec"]["network"]["inNetwork"]
    return spec.from_dict(raw)


def _csv_sum(paths: list[Path], column: str) -> float:
    total = 0
    for path in paths:
        if path.exists():
            with open(path, newline="") as f:
                total += sum(int(r[column]) for r in csv.DictReader(f))
    return float(total)


def measure(results: Path) -> dict[str, Any]:
    metrics = json.loads((results / "metrics.json").read_text())
    links = json.loads((results / "network.json").read_text())["pod_links"]
    iterations = metrics["iterations"]
    return {"ps_rx_kb_per_iteration": links["ps-0"]["rx_bytes"] / iterations / 1e3,
            "ps_tx_kb_per_iteration": links["ps-0"]["tx_bytes"] / iterations / 1e3,
            "iteration_ms": 1e3 * metrics["scheduling"]["iteration_s"],
            "jct_s": metrics["jct_s"], "accuracy": metrics["final_accuracy"],
            "flushed_slots": _csv_sum([results / "agg-ps-0.csv"], "flushed_slots"),
            "missing_contributions": _csv_sum([results / "agg-ps-0.csv"],
                                              "missing_contributions"),
            "repaired_slots": _csv_sum(sorted(results.glob("mcast-worker-*.csv")),
                                       "repaired_slots"),
            **hostcheck.columns(metrics.get("fidelity")),
            "during": hostcheck.during(metrics.get("fidelity"))}


COLUMNS = ("ps_rx_kb_per_iteration", "ps_tx_kb_per_iteration", "iteration_ms", "jct_s",
           "accuracy", "flushed_slots", "missing_contributions", "repaired_slots")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--loss", type=float, default=0.0)
    ap.add_argument("--bandwidth", metavar="RATE", help="every link's rate, as the spec "
                    "writes it (e.g. 200Mbit; default: the example's 1Gbit)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, of {', '.join(VARIANTS)}")
    hostcheck.add_arguments(ap)
    args = ap.parse_args()
    watch = hostcheck.before(args)
    variants = args.variants.split(",")
    rows: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for seed in range(args.repeats):
        for variant in variants:
            with tempfile.TemporaryDirectory(prefix="innet-bench-") as out:
                local.run(job(variant, seed, args.epochs, args.loss, args.bandwidth), Path(out),
                          progress=lambda line: None)
                row = measure(Path(out))
            rows[variant].append(row)
            print(f"seed {seed} {variant:>9}: " + ", ".join(
                f"{k} {row[k]:.4g}" for k in COLUMNS) + f"; {row['during']}", flush=True)
    med = {v: {k: statistics.median(r[k] for r in rs) for k in COLUMNS}
           for v, rs in rows.items()}
    print(f"\nsparse, 8 workers in 2 racks, PS in a third, {args.bandwidth or '1Gbit'} "
          f"links, loss {args.loss:g}, "
          f"{args.epochs} epochs; medians of {args.repeats} seeds")
    print(f"{'':>24}" + "".join(f"{v:>11}" for v in variants)
          + "".join(f"{'none/' + v:>16}" for v in variants if v != "none"))
    for k in COLUMNS:
        line = f"{k:>24}" + "".join(f"{med[v][k]:11.4g}" for v in variants)
        if "none" in med:
            for v in variants:
                if v != "none":
                    b = med[v][k]
                    line += f"{med['none'][k] / b:16.3f}" if b else " " * 16
        print(line)
    for v in (v for v in variants if v != "none" and "none" in rows):
        print(f"none/{v}: " + hostcheck.mark({u: [r["verdict"] for r in rows[u]]
                                              for u in ("none", v)}))
    for v, rs in rows.items():
        print(f"final accuracy over seeds, {v}: "
              + " ".join(f"{r['accuracy']:.4f}" for r in rs))
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
