"""Helpers for whole-run tests: start the CLI, wait for training, check cleanup."""

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tailcut import spec
from tailcut.net import clean, naming, netns
from tests import waiting

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# The in-network runs' length: the examples' sparse job with its 8 workers in two racks
# (in-network-aggregation.yaml, in-network-whole-iteration.yaml), and the PS alone
# they are compared with (tests/runtime/conftest.py runs that one once).
SPARSE_ITERATIONS = 40

_programs_before: set[int] = set()


def note_programs_before() -> None:
    """Remember tailcut's BPF programs present before a test (tests/runtime/conftest.py
    calls it), so one left by a concurrent run of someone else is not blamed on it."""
    _programs_before.clear()
    _programs_before.update(_tailcut_programs())


def nothing_of(job: str) -> None:
    """Assert the host holds no namespace, link, process or BPF program of `job`."""
    assert clean.leftovers(job) == []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert naming.alias(job) not in links
    # BPF programs are freed after an RCU grace period
    assert waiting.until(lambda: not _tailcut_programs() - _programs_before, every_s=0.1)


def _tailcut_programs() -> set[int]:
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True,
                         text=True).stdout
    return {p["id"] for p in json.loads(out or "[]")
            if str(p.get("name", "")).startswith("tailcut")}


def start_cli(job_file: Path, results: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tailcut.cli", "run", str(job_file),
                             "--results-dir", str(results)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_training(run: subprocess.Popen, job: str, pod: str,
                      timeout_s: float = 30) -> list[int]:
    """Wait until pod `pod` of `job` has a process in it; return the pids. The
    runner itself may be inside for a moment while it builds: never count it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if run.poll() is not None:
            raise AssertionError(f"the run ended early: {run.communicate()}")
        pids = [p for p in netns.pids_inside(naming.pod_netns(job, pod)) if p != run.pid]
        if pids:
            time.sleep(1.0)  # let it get past start-up into training
            return pids
        time.sleep(0.1)
    raise AssertionError(f"{pod} of {job} never started")


def sparse_job(example: str, name: str, in_network: dict | None, loss: float = 0.0
               ) -> spec.model.TrainingJob:
    """`example` (under examples/) as `name`, for SPARSE_ITERATIONS iterations with no
    target, its inNetwork section replaced by `in_network` (None: the PS alone) and
    `loss` on the access links."""
    raw = yaml.safe_load((EXAMPLES / example).read_text())
    raw["metadata"]["name"] = name
    raw["spec"]["training"].pop("targetAccuracy")
    raw["spec"]["training"]["iterations"] = SPARSE_ITERATIONS
    if loss:
        raw["spec"]["network"]["accessLink"]["loss"] = loss
    if in_network is None:
        del raw["spec"]["network"]["inNetwork"]
    else:
        raw["spec"]["network"]["inNetwork"] = in_network
    return spec.from_dict(raw)
