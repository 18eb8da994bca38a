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
from matplotlib.figure import Figure

from tailcut.reports import condition, style
from tailcut.training import allreduce

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
    fig = draw(read(results_dir, 0), summary, title, condition.of_results(results_dir))
    style.save(fig, results_dir / "allreduce.png")
    return summary


def draw(rank0: dict[str, np.ndarray], summary: dict[str, Any], title: str = "",
         subtitle: str = "") -> Figure:
    """allreduce.png: rank 0's iteration and all-reduce times by iteration (a
    retransmission timeout shows as a spike), not yet written; `subtitle` is the run's
    condition (tailcut.reports.condition)."""
    fig, ax = style.figure()
    ax.plot(rank0["step"], rank0["iteration_ms"], ".", ms=3, color="tab:gray",
            label="whole iteration")
    ax.plot(rank0["step"], rank0["allreduce_ms"], ".", ms=3, color="tab:blue",
            label="all-reduce (Gloo)")
    style.log_scale(ax, "y")
    ax.set_xlabel("iteration")
    ax.set_ylabel("time on rank 0 (ms, log scale)")
    ax.grid(alpha=0.3)
    style.legend(ax)
    a = summary["allreduce_ms"]
    style.title(fig, style.titled(title, f"per-iteration times (all-reduce, all ranks: "
                                        f"p50 {a['p50']:.1f} ms, p99 {a['p99']:.1f} ms)"),
                subtitle=subtitle)
    return fig


def describe(summary: dict[str, Any]) -> str:
    a, i = summary["allreduce_ms"], summary["iteration_ms"]
    return (f"all-reduce per iteration (all ranks): p50 {a['p50']:.1f} ms, p99 "
            f"{a['p99']:.1f} ms, max {a['max']:.1f} ms; iteration p50 {i['p50']:.1f} ms, "
            f"p99 {i['p99']:.1f} ms (allreduce.json, allreduce.png)")
