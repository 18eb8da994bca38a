"""In-network aggregation at the ToRs against the PS summing alone, side by side in one run.

    sudo .venv/bin/python bench/innet_agg.py [--repeats 3] [--epochs 2] [--loss 0.01]

examples/in-network-aggregation.yaml: the sparse click model with Zipf-skewed ids, 1 PS
in a rack of its own and 8 workers in two racks of four, 1 Gbit/s links, over tcp, for
a fixed number of epochs (no accuracy target, so both variants do the same work). Each
repeat runs both variants with the same seed (seeds 0, 1, ...), interleaved. Prints per
run and as medians: the bytes the PS's link received per iteration, the median
iteration time (metrics.json), JCT, final test accuracy, and for the aggregated runs
the slots the PS had to flush and the workers' contributions that never made a sum.
--loss puts that loss on every access link (both directions). Root."""

import argparse
import csv
import json
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tailcut import spec  # noqa: E402
from tailcut.runtime import local  # noqa: E402


def job(aggregate: bool, seed: int, epochs: int, loss: float) -> spec.model.TrainingJob:
    raw = yaml.safe_load((ROOT / "examples" / "in-network-aggregation.yaml").read_text())
    raw["metadata"]["name"] = f"agg-bench-{'tor' if aggregate else 'ps'}"
    training = raw["spec"]["training"]
    training.pop("targetAccuracy")
    training.update(epochs=epochs, seed=seed)
    if loss:
        raw["spec"]["network"]["accessLink"]["loss"] = loss
    if not aggregate:
        del raw["spec"]["network"]["inNetwork"]
    return spec.from_dict(raw)


def measure(results: Path) -> dict[str, float]:
    metrics = json.loads((results / "metrics.json").read_text())
    links = json.loads((results / "network.json").read_text())["pod_links"]
    iterations = metrics["iterations"]
    row = {"ps_rx_kb_per_iteration": links["ps-0"]["rx_bytes"] / iterations / 1e3,
           "iteration_ms": 1e3 * metrics["scheduling"]["iteration_s"],
           "jct_s": metrics["jct_s"], "accuracy": metrics["final_accuracy"],
           "flushed_slots": 0.0, "missing_contributions": 0.0}
    sums = results / "agg-ps-0.csv"
    if sums.exists():
        with open(sums, newline="") as f:
            per_iteration = list(csv.DictReader(f))
        for k in ("flushed_slots", "missing_contributions"):
            row[k] = float(sum(int(r[k]) for r in per_iteration))
    return row


COLUMNS = ("ps_rx_kb_per_iteration", "iteration_ms", "jct_s", "accuracy", "flushed_slots",
           "missing_contributions")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--loss", type=float, default=0.0)
    args = ap.parse_args()
    rows: dict[str, list[dict[str, float]]] = {"ps": [], "tor": []}
    for seed in range(args.repeats):
        for variant in ("ps", "tor"):
            with tempfile.TemporaryDirectory(prefix="agg-bench-") as out:
                local.run(job(variant == "tor", seed, args.epochs, args.loss), Path(out),
                          progress=lambda line: None)
                row = measure(Path(out))
            rows[variant].append(row)
            print(f"seed {seed} {variant:>3}: " + ", ".join(
                f"{k} {row[k]:.4g}" for k in COLUMNS), flush=True)
    med = {v: {k: statistics.median(r[k] for r in rs) for k in COLUMNS}
           for v, rs in rows.items()}
    print(f"\nsparse, 8 workers in 2 racks, PS in a third, 1 Gbit/s, loss {args.loss:g}, "
          f"{args.epochs} epochs; medians of {args.repeats} seeds")
    print(f"{'':>24}{'PS sums':>12}{'ToR sums':>12}{'PS/ToR':>9}")
    for k in COLUMNS:
        a, b = med["ps"][k], med["tor"][k]
        ratio = f"{a / b:9.3f}" if b else " " * 9
        print(f"{k:>24}{a:12.4g}{b:12.4g}{ratio}")
    spread = {v: (min(r["accuracy"] for r in rs), max(r["accuracy"] for r in rs))
              for v, rs in rows.items()}
    print(f"final accuracy over seeds: PS sums {spread['ps'][0]:.4f}-{spread['ps'][1]:.4f}, "
          f"ToR sums {spread['tor'][0]:.4f}-{spread['tor'][1]:.4f}")


if __name__ == "__main__":
    main()
