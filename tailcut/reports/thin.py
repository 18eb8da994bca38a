"""Fewer points for a curve that looks the same: what the report's plots draw.

A run's dissection plots tens of thousands of points (3,500 RPC latencies, 9,000
connection windows, a 65,000-parameter model's cumulative update share) into a
700-pixel-wide figure; rendering them took half of the report's time. Each helper
keeps the points a reader can tell apart and drops the rest, so the curve moves by
well under a pixel: the numbers behind the plots (dissection.json, the CSVs) keep
every point.
"""

from __future__ import annotations

import numpy as np

MAX_POINTS = 1000   # per curve: ~1.4 points per pixel of a 7-inch, 100-dpi figure


def cdf(values: np.ndarray | list[float] | list[int],
        max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF of `values` as (sorted values, fraction <= each), thinned.
    Few distinct values (counts, say): the first and last point of each run of equal
    values, so a step plot draws exactly the same stairs. Many: about `max_points`
    points evenly spaced in rank (the fraction moves by about 1/max_points from one
    to the next) plus the smallest and largest value."""
    x = np.sort(np.asarray(values, dtype=float))
    n = x.size
    y = np.arange(1, n + 1) / max(n, 1)
    if n <= max_points:
        return x, y
    last_of_run = np.flatnonzero(np.diff(x))
    if 2 * (last_of_run.size + 1) <= max_points:
        keep = np.unique(np.concatenate(([0, n - 1], last_of_run, last_of_run + 1)))
    else:
        keep = np.unique(np.linspace(0, n - 1, max_points).round().astype(np.int64))
    return x[keep], y[keep]


def log_spaced(n: int, max_points: int = MAX_POINTS) -> np.ndarray:
    """Indices 0..n-1 to draw a curve over k = 1..n on a log axis: about `max_points`
    k's evenly spaced in log k, always the first and the last (all of them when n is
    small)."""
    if n <= max_points:
        return np.arange(n)
    ks = np.geomspace(1, n, max_points).round().astype(np.int64)
    return np.unique(np.concatenate(([1, n], ks))) - 1
