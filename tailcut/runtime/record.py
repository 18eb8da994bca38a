"""A run's own record, run.json: what ran, where, on what, and how it ended.

A figure is only as good as what is known about the run that gave it. Every results
directory gets, before anything is built, the tailcut version and commit, the
kernel, the cores and the host's load; and when the run ends, how it ended
("finished", "target-not-reached", "failed", "interrupted") and its fidelity
verdict. A run killed outright leaves "running", which says the same.

A directory that already holds a run's record is refused: two runs' files would mix.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import tailcut
from tailcut.errors import RunError
from tailcut.fidelity import hostcpu

FILE = "run.json"
# files by which a directory is known to hold a run's results already
RESULT_FILES = (FILE, "metrics.json")
STATES = ("running", "finished", "target-not-reached", "failed", "interrupted")


def commit() -> str | None:
    """tailcut's git commit, with '-dirty' for uncommitted changes; None outside a
    checkout (an installed wheel)."""
    top = Path(tailcut.__file__).resolve().parents[1]
    if not (top / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(top), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(top), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (head + ("-dirty" if dirty else "")) or None


def host() -> dict[str, Any]:
    return {"kernel": platform.release(), "machine": platform.machine(),
            "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
            "load1_before": hostcpu.load1()}


def start(results_dir: Path, job_name: str) -> None:
    """Refuse a directory with a run's results in it; write run.json as 'running'."""
    taken = [name for name in RESULT_FILES if (results_dir / name).exists()]
    if taken:
        raise RunError(f"{results_dir} already holds a run's results ({taken[0]}): "
                       "choose another --results-dir or remove it, so that two runs' "
                       "files do not mix")
    results_dir.mkdir(parents=True, exist_ok=True)
    _write(results_dir, {"job": job_name, "state": "running", "started": _now(),
                         "tailcut": {"version": tailcut.__version__, "commit": commit()},
                         "host": host()})


def finish(results_dir: Path, state: str, **extra: Any) -> None:
    """Record how the run ended (one of STATES) and `extra` (e.g. fidelity)."""
    assert state in STATES, state
    path = results_dir / FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return   # never started here: nothing to add to
    _write(results_dir, {**data, "state": state, "ended": _now(), **extra})


def _write(results_dir: Path, data: dict[str, Any]) -> None:
    (results_dir / FILE).write_text(json.dumps(data, indent=2) + "\n")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
