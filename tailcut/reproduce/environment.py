"""The versions and machine facts a report states: what ran, where, on what kernel."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

_PACKAGES = ("tailcut", "numpy", "pydantic", "pyroute2", "matplotlib", "locust")


def collect() -> dict[str, Any]:
    """Versions of Python, tailcut and its dependencies, the kernel, CPUs, memory, load."""
    versions = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": platform.node(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "git_commit": _git_commit(),
        "versions": versions,
    }


def doctor() -> str:
    """`tailcut doctor`'s table (what this kernel supports), as the command prints it."""
    done = subprocess.run([sys.executable, "-m", "tailcut.cli", "doctor"],
                          capture_output=True, text=True, timeout=120, check=False)
    return done.stdout + done.stderr


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _git_commit() -> str:
    """The checkout's commit when tailcut runs from one (an installed wheel has none)."""
    source = Path(__file__).resolve().parents[2]
    try:
        done = subprocess.run(["git", "-C", str(source), "describe", "--always", "--dirty"],
                              capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown (not a git checkout)"
