"""Flow-size distributions a background load can name: published datacenter CDFs.

Each CDF is a list of (flow size in bytes, cumulative probability) points; a flow size
is drawn by inverting the CDF with linear interpolation between points, which is how
the simulators that published them (ns-2 for pFabric, the empirical traffic generator)
read them. The points are written here, not downloaded.

web-search   DCTCP's measured web-search workload: Alizadeh et al., "Data Center TCP
             (DCTCP)", SIGCOMM 2010, Fig. 4 (background flows); the same points drive
             pFabric (Alizadeh et al., SIGCOMM 2013, Fig. 4a) and were published as the
             file DCTCP_CDF of the empirical-traffic-gen tool. Mean 1.71 MB.
data-mining  VL2's measured data-mining workload: Greenberg et al., "VL2", SIGCOMM 2009,
             Fig. 2, as used by pFabric (Fig. 4b) and published as VL2_CDF. Very
             heavy-tailed: 80% of flows are under 10 kB, the largest are 1 GB. Mean
             12.7 MB; cap it with flowSizes.maxBytes for short runs.
"""

import bisect
import random

CDFS: dict[str, tuple[tuple[int, float], ...]] = {
    "web-search": (
        (0, 0.0), (10_000, 0.15), (20_000, 0.2), (30_000, 0.3), (50_000, 0.4),
        (80_000, 0.53), (200_000, 0.6), (1_000_000, 0.7), (2_000_000, 0.8),
        (5_000_000, 0.9), (10_000_000, 0.97), (30_000_000, 1.0),
    ),
    "data-mining": (
        (0, 0.0), (180, 0.1), (216, 0.2), (560, 0.3), (900, 0.4), (1_100, 0.5),
        (1_870, 0.6), (3_160, 0.7), (10_000, 0.8), (400_000, 0.9), (3_160_000, 0.95),
        (100_000_000, 0.98), (1_000_000_000, 1.0),
    ),
}
DISTRIBUTIONS = tuple(CDFS) + ("fixed",)


def truncated(points: tuple[tuple[int, float], ...],
              max_bytes: int | None) -> tuple[tuple[int, float], ...]:
    """The CDF with every size above `max_bytes` moved to `max_bytes` (a cap, as a
    short run cannot hold a 1 GB flow): the curve is cut at `max_bytes` and jumps to 1."""
    if max_bytes is None or max_bytes >= points[-1][0]:
        return points
    out = []
    for (x0, p0), (x1, p1) in zip(points, points[1:]):
        out.append((x0, p0))
        if x1 >= max_bytes:
            p_cut = p0 + (p1 - p0) * (max_bytes - x0) / (x1 - x0) if x1 > x0 else p1
            out.append((max_bytes, p_cut))
            break
    out.append((max_bytes, 1.0))
    return tuple(out)


def mean_bytes(points: tuple[tuple[int, float], ...]) -> float:
    """Mean flow size of a piecewise-linear CDF (uniform between points; a vertical
    step, as made by a cap, is a point mass)."""
    return sum((p1 - p0) * (x0 + x1) / 2 for (x0, p0), (x1, p1) in zip(points, points[1:]))


def sample(points: tuple[tuple[int, float], ...], rng: random.Random) -> int:
    """One flow size in bytes (at least 1) drawn by inverting the CDF."""
    u = rng.random()
    probs = [p for _, p in points]
    i = max(1, bisect.bisect_left(probs, u))
    (x0, p0), (x1, p1) = points[i - 1], points[i]
    size = x1 if p1 == p0 else x0 + (x1 - x0) * (u - p0) / (p1 - p0)
    return max(1, round(size))
