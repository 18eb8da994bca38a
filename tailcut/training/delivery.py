"""What a lossy transport delivered: the share of coordinates that arrived and the
repair rounds it took, from the roles' messages*.csv (tailcut.training.records).

A bounded-loss run is judged by its own figures, not by the TCP counters of its
control channel: how much of each gradient and model reached its receiver, and how
many NACK rounds that took.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


def summarize(results_dir: Path) -> dict[str, Any]:
    """Over every data message received (rows with coordinates): totals, the
    delivered share, the share of messages that lacked any, and repair rounds."""
    coordinates = missing = incomplete = 0
    repairs: list[int] = []
    for path in sorted(results_dir.glob("messages*.csv")):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                count = int(row.get("coordinates") or 0)
                if count <= 0:
                    continue
                lost = int(row["missing"])
                coordinates += count
                missing += lost
                incomplete += lost > 0
                repairs.append(int(row.get("repairs") or 0))
    if not repairs:
        return {"messages": 0}
    rounds = np.asarray(repairs)
    return {"messages": len(repairs), "coordinates": coordinates, "missing": missing,
            "delivered": round(1 - missing / coordinates, 5),
            "incomplete_share": round(incomplete / len(repairs), 4),
            "repairs": {"median": float(np.median(rounds)),
                        "p99": float(np.percentile(rounds, 99)), "max": int(rounds.max())}}


def describe(summary: Mapping[str, Any], transport: str) -> str:
    if not summary.get("messages"):
        return f"{transport}: no data message was recorded"
    r = summary["repairs"]
    return (f"{transport}: {100 * summary['delivered']:.2f}% of coordinates delivered over "
            f"{summary['messages']} data messages ({100 * summary['incomplete_share']:.1f}% "
            f"of them incomplete); repair rounds per message median {r['median']:g}, "
            f"p99 {r['p99']:g}, max {r['max']}")
