"""Where CadentFlow can beat ordered TCP, and how far any scheduler could: a sweep of
settings, each with the baseline's distance from its floors.

The paper's baseline is TCP that sends each node's parameters "in the best possible
order" (ordered TCP, `tcp`); its headline is CadentFlow up to 25% faster. A scheduler can
only save what the baseline spends above the iteration's floor, so every row carries:

- the compute floor: the slowest worker's forward + backward time (an infinitely fast
  network), and the baseline's distance from it (tcp / compute floor - 1);
- the floor: the largest of the compute floor and a bound per link that no schedule of
  this job's messages can beat (`floor_s`, below), and `headroom` = 1 - floor / tcp, the
  largest fraction of the baseline's iteration time any scheduler could save.

The link bounds (Jackson's rule on one link, fluid, all flows of one job):

- pulls on link l: a pull of layer k to worker w leaves, once it arrives, at least
  w's forward from layer k on and its whole backward (its tail q); for any schedule
  the largest (arrival + q) is at least, over thresholds q*, the bytes of the pulls
  on l with q >= q*, over l's rate, plus q*;
- pushes on link l: the push of layer k by worker w is released no earlier than w's
  forward end (itself bounded by w's compute and its own pulls, as above) plus its
  backward from the last layer down to k; the pushes released at or after r* all end
  at least their bytes over l's rate after r*.

A flow between a worker and its colocated PS crosses no link and adds nothing. With two
jobs, each job's floor counts only its own messages (the other's only slow it down).

    rows = headroom.sweep(headroom.settings("quick"))
    print(headroom.format_table(rows))
"""

from __future__ import annotations

import csv
import json
import multiprocessing
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from tailcut.reports import style
from tailcut.simulate import architectures, engine, experiments, topology

GBIT = 1e9
HALF_THE_CLAIM = 0.125   # the paper's "up to 25%", halved: what the sweep looks for
PLACEMENTS = ("star", "colocated", "fast-ps-nics", "slow-worker-nic", "straggler",
              "racks-4to1", "two-jobs")
FAST_PS_NIC = 4.0        # fast-ps-nics: PS NICs this many times the workers' (40 vs 10)
SLOW_WORKER_NIC = 0.25   # slow-worker-nic: worker 0's NIC at this fraction (2.5 of 10)
STRAGGLER = 1.5          # straggler: worker 0 computes this many times slower
OVERSUBSCRIPTION = 4.0   # racks-4to1: each rack's uplink = its NICs / this
TWO_JOB_ITERATIONS = 3   # two-jobs: iterations per job; the first is dropped
VARIANTS = (  # column, policy, tags, tcp order
    ("tcp", "fair", "priority", "ordered"),
    ("tcp_random", "fair", "priority", "random"),
    ("cadentflow_priority", "cadentflow", "priority", "ordered"),
    ("cadentflow_deadline", "cadentflow", "deadline", "ordered"),
)


@dataclass(frozen=True)
class Setting:
    """One point of the sweep: where the job runs and how fast it computes."""

    placement: str
    model: str
    workers: int
    ps: int
    compute_scale: float
    nic_bit: float = 10 * GBIT

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement {self.placement!r}: must be one of "
                             f"{', '.join(PLACEMENTS)}")
        if self.placement == "colocated" and self.workers != self.ps:
            raise ValueError(f"colocated: workers ({self.workers}) and ps ({self.ps}) "
                             f"must be equal, one of each per node")
        if self.placement == "two-jobs" and (self.workers, self.ps) != (8, 8):
            raise ValueError("two-jobs: the paper's Fig. 4 layout has 8 workers and 8 PS "
                             "per job")

    def condition(self) -> str:
        """The setting in words, as the report states it."""
        nic = f"{self.nic_bit / GBIT:g} Gbit/s NICs"
        where = {
            "star": "one non-blocking switch",
            "colocated": "each node a worker and a PS, one switch",
            "fast-ps-nics": f"PS NICs {FAST_PS_NIC:g}x the workers', one switch",
            "slow-worker-nic": f"worker 0's NIC at {SLOW_WORKER_NIC:g}x, one switch",
            "straggler": f"worker 0 computes {STRAGGLER:g}x slower, one switch",
            "racks-4to1": f"workers and PSs in two racks, uplinks {OVERSUBSCRIPTION:g}:1 "
                          f"oversubscribed",
            "two-jobs": "two jobs sharing a rack uplink (the paper's Fig. 4)",
        }[self.placement]
        return (f"{self.model}, {self.workers} workers / {self.ps} PS, {where}, {nic}, "
                f"compute x{self.compute_scale:g} of K80")


def build(setting: Setting,
          arch: architectures.Architecture) -> tuple[topology.Fabric, list[engine.Job]]:
    """The fabric and fresh jobs of a setting."""
    w, p, bit = setting.workers, setting.ps, setting.nic_bit
    workers, servers = list(range(w)), list(range(w, w + p))
    slowdown = None
    if setting.placement == "two-jobs":
        fabric = topology.shared_racks(bit)
        return fabric, [
            engine.Job("a", arch, list(range(0, 8)), list(range(8, 12)) + list(range(24, 28)),
                       TWO_JOB_ITERATIONS),
            engine.Job("b", arch, list(range(12, 20)),
                       list(range(20, 24)) + list(range(28, 32)), TWO_JOB_ITERATIONS)]
    if setting.placement == "colocated":
        return topology.star(w, bit), [engine.Job(setting.model, arch, workers, workers)]
    fabric = topology.star(w + p, bit)
    if setting.placement == "fast-ps-nics":
        fabric = topology.Fabric(bit, fabric.rack_of,
                                 node_nic_bit=(bit,) * w + (FAST_PS_NIC * bit,) * p)
    elif setting.placement == "slow-worker-nic":
        fabric = topology.Fabric(bit, fabric.rack_of,
                                 node_nic_bit=(SLOW_WORKER_NIC * bit,) + (bit,) * (w + p - 1))
    elif setting.placement == "racks-4to1":
        fabric = topology.Fabric(bit, (0,) * w + (1,) * p,
                                 (w * bit / OVERSUBSCRIPTION, p * bit / OVERSUBSCRIPTION))
    elif setting.placement == "straggler":
        slowdown = [STRAGGLER] + [1.0] * (w - 1)
    return fabric, [engine.Job(setting.model, arch, workers, servers,
                               worker_slowdown=slowdown)]


# -- floors --------------------------------------------------------------------------
def compute_floor_s(job: engine.Job) -> float:
    """The iteration time with an infinitely fast network: the slowest worker's compute."""
    worst = max(job.slowdown(w) for w in range(len(job.workers)))
    return worst * job.arch.compute_s


def _jackson(bytes_: np.ndarray, key: np.ndarray, rate: float) -> float:
    """max over thresholds t of (bytes of the items with key >= t) / rate + t: the
    least possible max(completion + tail) of items with tails `key` on one link
    (pulls), or the least makespan of items released at `key` (pushes)."""
    order = np.argsort(-key, kind="stable")
    return float(np.max(np.cumsum(bytes_[order]) / rate + key[order]))


def _link_names(fabric: topology.Fabric, job: engine.Job) -> list[str]:
    """Each link by the role of its node in `job`: "PS 2's NIC down", "rack 1 uplink up"."""
    roles = []
    for node in range(fabric.nodes):
        role = [f"{kind} {nodes.index(node)}" for kind, nodes in
                (("worker", job.workers), ("PS", job.ps)) if node in nodes]
        roles.append(" + ".join(role) or f"node {node}")
    names = [f"{r}'s NIC up" for r in roles] + [f"{r}'s NIC down" for r in roles]
    for r in range(len(fabric.uplink_bit)):
        names += [f"rack {r} uplink up", f"rack {r} uplink down"]
    return names


def floor_s(fabric: topology.Fabric, job: engine.Job) -> tuple[float, str]:
    """The least iteration time any schedule of `job`'s messages on `fabric` can reach
    (see the module's docstring), and what sets it: "compute" or a link's name."""
    layers = job.arch.layers
    fwd = np.array([l.fwd_s for l in layers])
    bwd = np.array([l.bwd_s for l in layers])
    size = np.array([float(l.bytes) for l in layers])
    fwd_from = np.cumsum(fwd[::-1])[::-1]       # forward of layers k..L-1
    bwd_from = np.cumsum(bwd[::-1])[::-1]       # backward of layers L-1..k
    owner = job.ps_of_layer()
    caps = fabric.capacities_byte()
    best, what = compute_floor_s(job), "compute"
    pulls: dict[int, list[tuple[float, float]]] = {}    # link -> (bytes, tail)
    pushes: dict[int, list[tuple[float, float]]] = {}   # link -> (bytes, release)
    for w, node in enumerate(job.workers):
        slow = job.slowdown(w)
        remote = [k for k in range(len(layers)) if job.ps[owner[k]] != node]
        # w's forward ends no earlier than its compute, nor than its own downlink allows.
        fwd_end = slow * float(fwd.sum())
        if remote:
            down = fabric.path(job.ps[owner[remote[0]]], node)[-1]
            fwd_end = max(fwd_end, _jackson(size[remote], slow * fwd_from[remote],
                                            caps[down]))
        for k in remote:
            ps = job.ps[owner[k]]
            for link in fabric.path(ps, node):
                pulls.setdefault(link, []).append(
                    (size[k], slow * (fwd_from[k] + bwd_from[0])))
            for link in fabric.path(node, ps):
                pushes.setdefault(link, []).append((size[k], fwd_end + slow * bwd_from[k]))
    names = _link_names(fabric, job)
    for kind, table in (("pulls", pulls), ("pushes", pushes)):
        for link, items in table.items():
            arr = np.array(items)
            bound = _jackson(arr[:, 0], arr[:, 1], caps[link])
            if bound > best:
                best, what = bound, f"{kind} on {names[link]}"
    return best, what


# -- the sweep -----------------------------------------------------------------------
def settings(grid: str = "full") -> list[Setting]:
    """The sweep's settings. `full`: four models (the paper's ResNet-v1-200 and CifarNet,
    ResNet-50, Inception-v3) x compute 1, 0.3, 0.1 of K80 x every placement at 8 workers
    / 8 PS (the paper's Fig. 2(a) shape), and the star also at 2/8, 8/2 and, for CifarNet,
    16/16 (the larger models' strict-priority runs at 16/16 take seconds each). `quick`:
    CifarNet the same way at compute 1 and 0.3; ResNet-v1-200 on the star at 8/8 and
    2/8."""
    if grid not in ("full", "quick"):
        raise ValueError(f"grid {grid!r}: must be 'full' or 'quick'")
    out = []
    if grid == "quick":
        for scale in (1.0, 0.3):
            out += [Setting("star", "resnet-v1-200", w, p, scale) for w, p in ((8, 8), (2, 8))]
            out += [Setting("star", "cifarnet", w, p, scale) for w, p in ((8, 8), (2, 8))]
            out += [Setting(placement, "cifarnet", 8, 8, scale) for placement in PLACEMENTS[1:]]
        return out
    for model in ("resnet-v1-200", "resnet-50", "inception-v3", "cifarnet"):
        for scale in (1.0, 0.3, 0.1):
            shapes = [(8, 8), (2, 8), (8, 2)] + ([(16, 16)] if model == "cifarnet" else [])
            out += [Setting("star", model, w, p, scale) for w, p in shapes]
            out += [Setting(placement, model, 8, 8, scale) for placement in PLACEMENTS[1:]]
    return out


def run(setting: Setting, arch: architectures.Architecture | None = None) -> dict[str, Any]:
    """One row: every variant's iteration time (the slower job's, with two), the floors,
    and the ratios."""
    arch = experiments.scaled(arch or architectures.get(setting.model),
                              setting.compute_scale)
    fabric, jobs = build(setting, arch)
    skip = 1 if len(jobs) > 1 else 0
    floors = [floor_s(fabric, job) for job in jobs]
    floor, floor_what = max(floors)
    row: dict[str, Any] = {
        "placement": setting.placement, "model": setting.model,
        "workers": setting.workers, "ps": setting.ps, "gbit": setting.nic_bit / GBIT,
        "compute_scale": setting.compute_scale,
        "compute_floor_s": max(compute_floor_s(job) for job in jobs),
        "floor_s": floor, "floor_set_by": floor_what}
    for column, policy, tags, tcp in VARIANTS:
        fabric, jobs = build(setting, arch)
        result = engine.Simulation(fabric, jobs, policy, tags, tcp).run()  # type: ignore[arg-type]
        row[f"{column}_s"] = max(result.mean_iteration_s(j, skip) for j in range(len(jobs)))
    tags = min(("priority", "deadline"), key=lambda t: float(row[f"cadentflow_{t}_s"]))
    row["cadentflow_s"] = row[f"cadentflow_{tags}_s"]
    row["cadentflow_tags"] = tags
    tcp_s = float(row["tcp_s"])
    row["cadentflow_vs_tcp"] = row["cadentflow_s"] / tcp_s
    row["cadentflow_vs_tcp_random"] = row["cadentflow_s"] / row["tcp_random_s"]
    row["tcp_over_compute_floor"] = tcp_s / row["compute_floor_s"] - 1
    row["tcp_random_over_compute_floor"] = row["tcp_random_s"] / row["compute_floor_s"] - 1
    row["headroom"] = 1 - floor / tcp_s
    row["gain"] = 1 - row["cadentflow_vs_tcp"]
    # Where there is room, is it reachable? Strict priority by (worker, layer), an
    # order across workers that the paper's tags cannot express (engine, "staggered").
    row["staggered_s"] = row["staggered_vs_tcp"] = ""
    if row["headroom"] >= HALF_THE_CLAIM:
        fabric, jobs = build(setting, arch)
        result = engine.Simulation(fabric, jobs, "cadentflow", "staggered").run()
        row["staggered_s"] = max(result.mean_iteration_s(j, skip) for j in range(len(jobs)))
        row["staggered_vs_tcp"] = row["staggered_s"] / tcp_s
    row["condition"] = setting.condition()
    return row


def sweep(points: Iterable[Setting], progress: Callable[[str], None] | None = None,
          processes: int = 1) -> list[dict[str, Any]]:
    """Every setting's row, in the order given; with `processes` > 1 the settings run in
    that many processes (spawned: each builds its own architectures)."""
    points = list(points)
    if processes > 1 and len(points) > 1:
        with multiprocessing.get_context("spawn").Pool(processes) as pool:
            rows = []
            for point, row in zip(points, pool.imap(run, points)):
                rows.append(row)
                if progress:
                    progress(point.condition())
            return rows
    archs: dict[str, architectures.Architecture] = {}
    rows = []
    for point in points:
        if point.model not in archs:
            archs[point.model] = architectures.get(point.model)
        started = time.perf_counter()
        rows.append(run(point, archs[point.model]))
        if progress:
            progress(f"{point.condition()}: {time.perf_counter() - started:.1f} s")
    return rows


def best(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The row where CadentFlow saves the most against ordered TCP (ties: the first)."""
    return min(rows, key=lambda r: float(r["cadentflow_vs_tcp"]))


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A fixed-width table: iteration times and the baseline's distance from its floors."""
    if not rows:
        return "(no rows)"
    head = ["placement", "model", "W/PS", "compute x", "compute s", "floor s", "TCP s",
            "TCP/compute-1", "headroom", "CF/TCP", "CF/TCP-random", "floor set by"]
    lines = [head]
    for r in rows:
        lines.append([r["placement"], r["model"], f"{r['workers']}/{r['ps']}",
                      f"{r['compute_scale']:g}", f"{r['compute_floor_s']:.4f}",
                      f"{r['floor_s']:.4f}", f"{r['tcp_s']:.4f}",
                      f"{r['tcp_over_compute_floor']:.3f}", f"{r['headroom']:.3f}",
                      f"{r['cadentflow_vs_tcp']:.3f}", f"{r['cadentflow_vs_tcp_random']:.3f}",
                      r["floor_set_by"]])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines)


def summary(rows: Sequence[dict[str, Any]]) -> list[str]:
    """What the sweep found, in sentences computed from its rows."""
    if not rows:
        return ["(no rows)"]
    top = best(rows)
    found = [r for r in rows if r["gain"] >= HALF_THE_CLAIM]
    room = [r for r in rows if r["headroom"] >= HALF_THE_CLAIM]
    lines = [f"Best CadentFlow against ordered TCP: {top['gain']:.1%} lower iteration time "
             f"({top['condition']}; {top['cadentflow_tags']} tags; ordered TCP "
             f"{top['tcp_s']:.4f} s, {top['tcp_over_compute_floor']:.1%} above the compute "
             f"floor; headroom {top['headroom']:.1%})."]
    lines.append(f"Settings where CadentFlow beats ordered TCP by at least "
                 f"{HALF_THE_CLAIM:.1%}: {len(found)} of {len(rows)}.")
    lines.append(f"Settings where any scheduler could (headroom >= {HALF_THE_CLAIM:.1%}): "
                 f"{len(room)} of {len(rows)}; in the other {len(rows) - len(room)} the "
                 f"floor proves no scheduler can.")
    if room:
        used = max(room, key=lambda r: r["gain"])
        lines.append(f"Of those, CadentFlow's largest gain: {used['gain']:.1%} of a "
                     f"{used['headroom']:.1%} headroom ({used['condition']}).")
        reach = min(room, key=lambda r: float(r["staggered_vs_tcp"]))
        lines.append(f"An order across workers (strict priority by worker, then layer; not "
                     f"the paper's tags) reaches {1 - float(reach['staggered_vs_tcp']):.1%} "
                     f"lower than ordered TCP there at best ({reach['condition']}; headroom "
                     f"{reach['headroom']:.1%}).")
    return lines


def draw(rows: Sequence[dict[str, Any]], title: str) -> Figure:
    """CadentFlow's gain over ordered TCP against the headroom (what any scheduler could
    save), one marker shape per placement, and where the headroom reaches half the claim
    the gain of an order across workers (x); every point lies on or under the diagonal."""
    fig, ax = style.figure()
    markers = dict(zip(PLACEMENTS, "osD^vP*"))
    for placement in PLACEMENTS:
        mine = [r for r in rows if r["placement"] == placement]
        if mine:
            ax.scatter([100 * r["headroom"] for r in mine], [100 * r["gain"] for r in mine],
                       marker=markers[placement], label=f"CadentFlow, {placement}",
                       alpha=0.75)
    probed = [r for r in rows if r["staggered_vs_tcp"] != ""]
    if probed:
        ax.scatter([100 * r["headroom"] for r in probed],
                   [100 * (1 - float(r["staggered_vs_tcp"])) for r in probed], marker="x",
                   color="black", label="order across workers (not the paper's tags)")
    top = max([100 * r["headroom"] for r in rows] + [100 * HALF_THE_CLAIM * 1.5])
    ax.plot([0, top], [0, top], color="grey", linewidth=1, label="gain = headroom (bound)")
    ax.axhline(100 * HALF_THE_CLAIM, color="black", linestyle="--", linewidth=1,
               label=f"{HALF_THE_CLAIM:.1%}: half the paper's 25%")
    ax.set_xlabel("headroom: 1 - floor / ordered TCP (%)")
    ax.set_ylabel("gain: 1 - scheduler / ordered TCP (%)")
    ax.grid(alpha=0.3)
    style.title(fig, title)
    style.legend(ax)
    return fig


def write(rows: Sequence[dict[str, Any]], out: Path, stem: str = "headroom") -> None:
    """rows as CSV, JSON and the fixed-width table, the summary, and the figure."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{stem}.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / f"{stem}.json").write_text(json.dumps(list(rows), indent=1))
    (out / f"{stem}.txt").write_text(format_table(rows) + "\n\n" + "\n".join(summary(rows))
                                     + "\n")
    style.save(draw(rows, "CadentFlow vs ordered TCP: gain against headroom, per setting"),
               out / f"{stem}.png")
