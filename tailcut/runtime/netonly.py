"""A job's network without its training: `tailcut net up / show / down JOB.yaml`.

What Mininet's `mn` and containerlab's `deploy` / `inspect` / `destroy` give: build a
topology, look at it and into it (`ip netns exec <namespace> ...`), take it down. The
network is the one `tailcut run` builds for the same file (tailcut.net.build: racks,
spine, access links and uplinks shaped both ways, eBPF droppers), and it stays up after
the command returns: the kernel keeps namespaces, links, qdiscs and tc programs
without a process. `down` is `tailcut clean` for the job.
"""

import os
import time
from dataclasses import dataclass
from typing import Callable

from tailcut import features, plan
from tailcut.datapath import dropper
from tailcut.errors import RunError
from tailcut.net import build, clean, topology
from tailcut.spec.model import TrainingJob

SHOWN_PODS = 20   # `up` lists this many pods; `show` lists them all


@dataclass(frozen=True)
class Built:
    job: str
    pods: int
    racks: int
    build_s: float


def up(job: TrainingJob, progress: Callable[[str], None] = print) -> Built:
    """Build `job`'s network and leave it up."""
    _need_root()
    plan.check(job, "local", features.netem)
    topo = topology.plan(job)
    started = time.monotonic()
    network = build.build(topo, features.netem().available, droppers=dropper)
    took = time.monotonic() - started
    first_pod, first_rack = topo.pods[0], topo.racks[0]
    progress(f"{job.name}: {len(topo.pods)} pods in {len(topo.racks)} rack(s) up in "
             f"{took:.2f} s; access links: {network.access_link_summary(first_pod)}; "
             f"uplinks: {network.applied[f'{first_rack.netns}/up']}")
    for line in _table(topo, SHOWN_PODS):
        progress(line)
    progress(f"enter a pod: ip netns exec {first_pod.netns} bash; "
             f"take it down: tailcut net down {job.name}")
    return Built(job.name, len(topo.pods), len(topo.racks), took)


def show(job: TrainingJob, progress: Callable[[str], None] = print) -> int:
    """List `job`'s pods and whether each namespace is up; returns how many are."""
    topo = topology.plan(job)
    present = set(clean.leftovers(job.name))
    progress(f"{job.name}: {len(present)} of {len(topo.namespaces())} namespaces up")
    for line in _table(topo, None, present):
        progress(line)
    return len(present)


def down(job: str, progress: Callable[[str], None] = print) -> list[str]:
    """Remove every namespace (and with them link, qdisc, program) of job `job`."""
    _need_root()
    started = time.monotonic()
    removed = clean.remove_job(job)
    progress(f"{job}: {len(removed)} namespace(s) removed in "
             f"{time.monotonic() - started:.2f} s")
    return removed


def _table(topo: topology.Topology, limit: int | None,
           present: set[str] | None = None) -> list[str]:
    rows = [(p.name, topo.racks[p.rack].name, p.ip, p.netns) for p in topo.pods]
    shown = rows if limit is None else rows[:limit]
    width = max(len(r[0]) for r in rows)
    lines = [f"  {'pod':<{width}}  {'rack':<8} {'address':<12} namespace"]
    for name, rack, ip, ns in shown:
        state = "" if present is None else ("  up" if ns in present else "  absent")
        lines.append(f"  {name:<{width}}  {rack:<8} {ip:<12} {ns}{state}")
    if len(shown) < len(rows):
        lines.append(f"  ... and {len(rows) - len(shown)} more (tailcut net show {topo.job})")
    return lines


def _need_root() -> None:
    if os.geteuid() != 0:
        raise RunError("the network needs root (it creates network namespaces); run as "
                       "root or through sudo")


__all__ = ["up", "show", "down", "Built"]
