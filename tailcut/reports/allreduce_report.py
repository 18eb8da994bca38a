"""A syncMode allreduce run's per-iteration all-reduce times: allreduce.json and allreduce.png.

Reads every rank's allreduce-worker-<i>.csv (tailcut.training.allreduce) and writes
the percentiles of the all-reduce and whole-iteration times per rank and over all
ranks, and a plot of rank 0's times by iteration, where a retransmission timeout
shows as a spike.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from tailcut.reports import plots  # noqa: F401 - chooses the Agg backend first
from tailcut.training import allreduce

import matplotlib.pyplot as plt  # noqa: E402 - after plots chose the backend

PERCENTILES = (50, 90, 99)


def read(results_dir: Path, rank: int) -> dict[str, np.ndarray]:
    """One rank's columns (allreduce_ms, iteration_ms, compute_ms) by step."""
    path = results_dir / allreduce.filename(rank)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path.name} has no iterations")
    return {k: np.array([float(r[k]) for r in rows])
            for k in ("step", "allreduce_ms", "iteration_ms", "compute_ms")}


def _stats(values: np.ndarray) -> dict[str, float]:
    out = {f"p{q}": round(float(np.percentile(values, q)), 3) for q in PERCENTILES}
    out["max"] = round(float(values.max()), 3)
    out["mean"] = round(float(values.mean()), 3)
    return out


def summarize(results_dir: Path, workers: int) -> dict[str, Any]:
    ranks = [read(results_dir, r) for r in range(workers)]
    both = {k: np.concatenate([r[k] for r in ranks]) for k in ("allreduce_ms", "iteration_ms")}
    return {"iterations": int(len(ranks[0]["step"])),
            "allreduce_ms": _stats(both["allreduce_ms"]),
            "iteration_ms": _stats(both["iteration_ms"]),
            "by_rank": [{"rank": i, "allreduce_ms": _stats(r["allreduce_ms"]),
                         "iteration_ms": _stats(r["iteration_ms"])}
                        for i, r in enumerate(ranks)]}


def report(results_dir: Path, workers: int, title: str = "") -> dict[str, Any]:
    summary = summarize(results_dir, workers)
    (results_dir / "allreduce.json").write_text(json.dumps(summary, indent=2) + "\n")
    rank0 = read(results_dir, 0)
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    try:
        ax.plot(rank0["step"], rank0["iteration_ms"], ".", ms=3, color="tab:gray",
                label="iteration")
        ax.plot(rank0["step"], rank0["allreduce_ms"], ".", ms=3, color="tab:blue",
                label="all-reduce (Gloo)")
        plots.log_scale(ax, "y")
        ax.set_xlabel("iteration")
        ax.set_ylabel("ms (rank 0)")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right")
        ax.set_title(f"{title}: per-iteration times, p50 "
                     f"{summary['allreduce_ms']['p50']:.1f} ms, p99 "
                     f"{summary['allreduce_ms']['p99']:.1f} ms")
        fig.tight_layout()
        fig.savefig(results_dir / "allreduce.png")
    finally:
        plt.close(fig)
    return summary


def describe(summary: dict[str, Any]) -> str:
    a, i = summary["allreduce_ms"], summary["iteration_ms"]
    return (f"all-reduce per iteration (all ranks): p50 {a['p50']:.1f} ms, p99 "
            f"{a['p99']:.1f} ms, max {a['max']:.1f} ms; iteration p50 {i['p50']:.1f} ms, "
            f"p99 {i['p99']:.1f} ms (allreduce.json, allreduce.png)")
