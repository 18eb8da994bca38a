"""Shared by the bounded-loss benchmarks: build a job's network with tailcut's own
builder, run a bench role in a pod, and summarise latencies."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tailcut import features, spec
from tailcut.datapath import dropper
from tailcut.net import build, topology
from tailcut.runtime import procs

ROLE = Path(__file__).with_name("bl_role.py")


def job(name: str, workers: int, loss: float, bandwidth: str = "1Gbit",
        transport: dict[str, Any] | None = None) -> Any:
    return spec.from_dict({
        "apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {"replicas": {"workers": workers},
                 "network": {"accessLink": {"bandwidth": bandwidth, "loss": loss}},
                 **({"transport": transport} if transport else {})}})


def planned_options(name: str, workers: int, loss: float, transport: dict[str, Any],
                    bandwidth: str = "1Gbit") -> dict[str, Any]:
    """The transport options `tailcut run` would give ps-0 of this network
    (plan.transport_options), for the bench roles (bl_role.py) to use as they are."""
    from tailcut import plan
    planned = job(name, workers, loss, bandwidth, transport)
    options = plan.transport_options(planned, topology.plan(planned).pod("ps-0"))
    options.pop("type")
    return options


@contextlib.contextmanager
def network(name: str, workers: int, loss: float,
            bandwidth: str = "1Gbit") -> Iterator[topology.Topology]:
    """One rack: ps-0 and `workers` workers, every access link shaped and lossy."""
    topo = topology.plan(job(name, workers, loss, bandwidth))
    net = build.build(topo, features.netem().available, droppers=dropper)
    try:
        yield topo
    finally:
        net.destroy()


def start(pod: topology.Pod, config: dict[str, Any], tree: Path | None = None,
          script: Path | None = None) -> subprocess.Popen[bytes]:
    """Run a bench role in ``pod``, with tailcut from ``tree`` (a checkout of another
    revision, to compare) or from this one: ``tree``'s bl_role.py, or ``script`` (a
    role of this tree's bench run against ``tree``'s tailcut)."""
    tree = tree or Path(__file__).resolve().parent.parent
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": str(tree)}
    role = script or tree / "bench" / ROLE.name
    return procs.spawn(pod.netns, [sys.executable, str(role), json.dumps(config)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def finish(proc: subprocess.Popen[bytes], timeout_s: float = 300) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"bench role failed ({proc.returncode}):\n{err.decode()[-3000:]}")
    return json.loads(out.decode().strip().splitlines()[-1])


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q))
