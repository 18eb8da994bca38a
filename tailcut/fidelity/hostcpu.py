"""The host's CPU over a window: how busy its cores were, and how long tasks waited.

/proc/stat counts, per state, the ticks all cores spent since boot; the difference of
two readings is the window's. Busy is everything but idle and iowait, so the kernel's
softirq work (the veths hand packets on in softirq) and a hypervisor's steal count,
which a role's own CPU time does not show. /proc/pressure/cpu's "some" total is the
time at least one runnable task waited for a core (PSI, where the kernel has it): a
host whose roles queue for the CPU shows it even when the busy share looks moderate.

Both files are host-wide also inside a container, so a role reads them the same way
under both executors. A window is a plain dict, so it travels in a role's events::

    {"wall_s": 12.0, "cores": 2, "busy": 0.93, "softirq": 0.11, "steal": 0.0,
     "psi_some": 0.41, "load1": 3.2}
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Optional

STAT = "/proc/stat"
PRESSURE = "/proc/pressure/cpu"
LOADAVG = "/proc/loadavg"
# /proc/stat's "cpu" line, in the kernel's order (Documentation/filesystems/proc.rst)
FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


@dataclass(frozen=True)
class Reading:
    """The host's counters at one moment."""

    at: float                     # time.monotonic()
    ticks: dict[str, int]         # per FIELDS, summed over all cores
    psi_some_us: Optional[int]    # None: the kernel has no PSI
    cores: int


def read() -> Reading:
    with open(STAT) as f:
        first = f.readline().split()
    ticks = {name: int(v) for name, v in zip(FIELDS, first[1:])}
    return Reading(at=time.monotonic(), ticks=ticks, psi_some_us=_psi_some_us(),
                   cores=os.cpu_count() or 1)


def _psi_some_us() -> Optional[int]:
    try:
        with open(PRESSURE) as f:
            for line in f:
                if line.startswith("some "):
                    return int(line.rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def load1() -> float:
    """The host's one-minute load average."""
    with open(LOADAVG) as f:
        return float(f.read().split()[0])


def window(before: Reading, after: Reading) -> dict[str, Any]:
    """The shares of the host's CPU over [before, after]: busy, softirq and steal as
    shares of all cores' time, psi_some as a share of the wall time (None without PSI)."""
    wall = max(after.at - before.at, 1e-9)
    delta = {k: after.ticks[k] - before.ticks[k] for k in FIELDS}
    total = sum(delta.values()) or 1
    idle = delta["idle"] + delta["iowait"]
    psi = None
    if before.psi_some_us is not None and after.psi_some_us is not None:
        psi = round(min(1.0, (after.psi_some_us - before.psi_some_us) / 1e6 / wall), 3)
    return {"wall_s": round(wall, 3), "cores": after.cores,
            "busy": round(1 - idle / total, 3),
            "softirq": round((delta["softirq"] + delta["irq"]) / total, 3),
            "steal": round(delta["steal"] / total, 3),
            "psi_some": psi, "load1": round(load1(), 2)}
