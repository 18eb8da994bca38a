"""The ToR's hot-parameter store against the PS alone, side by side in one run.

    sudo .venv/bin/python bench/innet_hot.py [--repeats 3] [--epochs 3] [--top-k 9216]

The IMC'20 setting (examples/in-network.yaml): the sparse click model with Zipf-skewed
ids, 1 PS and 8 workers in 2 racks at 1 Gbit/s, over tcp, for a fixed number of epochs
(no accuracy target, so both variants do the same work). Each repeat runs both
variants with the same seed (seeds 0, 1, ...), interleaved. Prints per run and as
medians: JCT, the PS's push and pull latency p50/p99 (dissection.json), the workers'
hot pull and push times (hot-worker-*.csv), the share of all updates the ToR applied,
final test accuracy, and the ratios without / with, marked with both variants' fidelity
verdicts (bench/README.md). Root."""

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

from bench import hostcheck  # noqa: E402
from tailcut import spec  # noqa: E402
from tailcut.runtime import local  # noqa: E402


def job(with_store: bool, seed: int, epochs: int, top_k: int) -> spec.model.TrainingJob:
    raw = yaml.safe_load((ROOT / "examples" / "in-network.yaml").read_text())
    raw["metadata"]["name"] = f"innet-bench-{'tor' if with_store else 'ps'}"
    training = raw["spec"]["training"]
    training.pop("targetAccuracy")
    training.update(epochs=epochs, seed=seed)
    if with_store:
        raw["spec"]["network"]["inNetwork"]["hotParameters"] = {"topK": top_k}
    else:
        del raw["spec"]["network"]["inNetwork"]
    return spec.from_dict(raw)


def hot_times(results: Path, op: str) -> list[float]:
    out = []
    for path in results.glob("hot-worker-*.csv"):
        with open(path, newline="") as f:
            out += [float(r["seconds"]) for r in csv.DictReader(f) if r["op"] == op]
    return out


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def measure(results: Path, jct: float, accuracy: float) -> dict[str, float]:
    d = json.loads((results / "dissection.json").read_text())
    row = {"jct_s": jct, "accuracy": accuracy,
           "push_p50_ms": d["push"]["median_us"] / 1e3, "push_p99_ms": d["push"]["p99_us"] / 1e3,
           "pull_p50_ms": d["pull"]["median_us"] / 1e3, "pull_p99_ms": d["pull"]["p99_us"] / 1e3,
           "tor_share": d["hot_parameters"].get("served_by_tor", 0.0)}
    for op in ("pull", "push"):
        times = hot_times(results, op)
        row[f"hot_{op}_p50_ms"] = 1e3 * p(times, 0.5)
        row[f"hot_{op}_p99_ms"] = 1e3 * p(times, 0.99)
    return row


COLUMNS = ("jct_s", "accuracy", "push_p50_ms", "push_p99_ms", "pull_p50_ms", "pull_p99_ms",
           "tor_share", "hot_pull_p50_ms", "hot_pull_p99_ms", "hot_push_p50_ms",
           "hot_push_p99_ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--top-k", type=int, default=9216)
    hostcheck.add_arguments(ap)
    args = ap.parse_args()
    watch = hostcheck.before(args)
    rows: dict[str, list[dict[str, float]]] = {"ps": [], "tor": []}
    verdicts: dict[str, list[str]] = {"PS only": [], "with ToR": []}
    for seed in range(args.repeats):
        for variant in ("ps", "tor"):
            with tempfile.TemporaryDirectory(prefix="innet-bench-") as out:
                r = local.run(job(variant == "tor", seed, args.epochs, args.top_k), Path(out),
                              progress=lambda line: None)
                row = measure(Path(out), r.jct_s, r.final_accuracy)
            rows[variant].append(row)
            verdicts["with ToR" if variant == "tor" else "PS only"].append(
                hostcheck.verdict_of(r.fidelity))
            print(f"seed {seed} {variant:>3}: " + ", ".join(
                f"{k} {row[k]:.4g}" for k in COLUMNS) + f"; {hostcheck.during(r.fidelity)}",
                flush=True)
    med = {v: {k: statistics.median(r[k] for r in rs) for k in COLUMNS}
           for v, rs in rows.items()}
    print(f"\nsparse, 8 workers, 1 Gbit/s, {args.epochs} epochs, top {args.top_k} parameters "
          f"in the ToR; medians of {args.repeats} seeds")
    print(f"{'':>16}{'PS only':>12}{'with ToR':>12}{'PS/ToR':>9}")
    for k in COLUMNS:
        a, b = med["ps"][k], med["tor"][k]
        ratio = f"{a / b:9.3f}" if b else " " * 9
        print(f"{k:>16}{a:12.4g}{b:12.4g}{ratio}")
    print(f"PS/ToR: {hostcheck.mark(verdicts)}")
    spread = {v: (min(r["accuracy"] for r in rs), max(r["accuracy"] for r in rs))
              for v, rs in rows.items()}
    print(f"final accuracy over seeds: PS only {spread['ps'][0]:.4f}-{spread['ps'][1]:.4f}, "
          f"with ToR {spread['tor'][0]:.4f}-{spread['tor'][1]:.4f}")
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
