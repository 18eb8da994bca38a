"""The paper's experiments in the simulator: Fig. 2 (training), Fig. 3 (inference) and
Fig. 4 (two jobs sharing a rack uplink), as tables of iteration time relative to TCP.

    rows = experiments.single_app(["resnet-50"], workers=[8], bandwidth_bit=[10e9])
    print(experiments.format_table(rows))

Baseline (ratio 1.0): `fair` with ordered TCP connections (the paper's baseline), with
its distance from the compute floor (`tcp_over_compute_floor`: TCP / compute floor - 1,
the most any scheduler could save, as a multiple of the compute). Also
shown: TCP with one flow per tensor (all at once, no ordering) and TCP connections
that send their messages in a random order (seeded). `compute_scale` multiplies
every layer's compute time (1.0 = the K80 of the paper's era, 0.1 = an accelerator ten
times faster), because whether ordering matters depends on how much of the
communication the compute can hide.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tailcut import papers
from tailcut.simulate import architectures, engine, topology

VARIANTS = [  # column, policy, tags, tcp
    ("tcp", "fair", "priority", "ordered"),
    ("tcp_per_tensor", "fair", "priority", "per-tensor"),
    ("tcp_random", "fair", "priority", "random"),
    ("coflow", "coflow", "priority", "ordered"),
    ("cadentflow_priority", "cadentflow", "priority", "ordered"),
    ("cadentflow_deadline", "cadentflow", "deadline", "ordered"),
]


def scaled(arch: architectures.Architecture, factor: float) -> architectures.Architecture:
    """The architecture with every compute time multiplied by `factor`."""
    layers = tuple(dataclasses.replace(l, fwd_s=l.fwd_s * factor, bwd_s=l.bwd_s * factor)
                   for l in arch.layers)
    return dataclasses.replace(arch, layers=layers)


def _iteration_s(fabric: topology.Fabric, jobs: list[engine.Job], policy: str, tags: str,
                 tcp: str, skip: int) -> list[float]:
    result = engine.Simulation(fabric, jobs, policy, tags, tcp).run()  # type: ignore[arg-type]
    return [result.mean_iteration_s(j, skip) for j in range(len(jobs))]


def single_app(models: Sequence[str], workers: Sequence[int], bandwidth_bit: Sequence[float],
               compute_scale: Sequence[float] = (1.0,), inference: bool = False) -> list[dict[str, Any]]:
    """One job of n workers and n PS on a star, for every combination given."""
    rows = []
    for name in models:
        base_arch = architectures.get(name)
        for scale in compute_scale:
            arch = scaled(base_arch, scale)
            for n in workers:
                for bw in bandwidth_bit:
                    fabric = topology.star(2 * n, bw)
                    row: dict[str, Any] = {"workload": "inference" if inference else "training",
                                 "model": name, "workers": n, "ps": n,
                                 "gbit": bw / 1e9, "compute_scale": scale,
                                 "compute_s": round(arch.compute_s, 6),
                                 "compute_floor_s": compute_floor_s(arch, inference)}
                    for column, policy, tags, tcp in VARIANTS:
                        job = engine.Job(name, arch, list(range(n)), list(range(n, 2 * n)),
                                         inference=inference)
                        row[column + "_s"] = _iteration_s(fabric, [job], policy, tags, tcp, 0)[0]
                    _add_ratios(row)
                    rows.append(row)
    return rows


def shared_link(models: Sequence[str], bandwidth_bit: float = 10e9,
                compute_scale: Sequence[float] = (1.0,), iterations: int = 5) -> list[dict[str, Any]]:
    """Fig. 4: jobs A and B (8 workers + 8 PS each); A on rack 0, B on rack 1, and
    4 PS of each on rack 2, whose uplink (6 NICs) they share. Both start at once.
    Ratios are to the single job under deadline CadentFlow, as in the paper."""
    rows = []
    fabric = topology.shared_racks(bandwidth_bit)
    a_nodes = (list(range(0, 8)), list(range(8, 12)) + list(range(24, 28)))
    b_nodes = (list(range(12, 20)), list(range(20, 24)) + list(range(28, 32)))
    for name in models:
        for scale in compute_scale:
            arch = scaled(architectures.get(name), scale)
            alone = _iteration_s(fabric, [engine.Job("a", arch, *a_nodes, iterations)],
                                 "cadentflow", "deadline", "ordered", 1)[0]
            row: dict[str, Any] = {"workload": "two jobs, shared uplink", "model": name,
                         "workers": 8, "ps": 8, "gbit": bandwidth_bit / 1e9,
                         "compute_scale": scale, "alone_s": alone,
                         "compute_floor_s": compute_floor_s(arch)}
            for column, policy, tags, tcp in VARIANTS:
                jobs = [engine.Job("a", arch, *a_nodes, iterations),
                        engine.Job("b", arch, *b_nodes, iterations)]
                times = _iteration_s(fabric, jobs, policy, tags, tcp, 1)
                row[column + "_s"] = max(times)
                row[column + "_vs_alone"] = max(times) / alone
            row["tcp_over_compute_floor"] = row["tcp_s"] / row["compute_floor_s"] - 1
            rows.append(row)
    return rows


def compute_floor_s(arch: architectures.Architecture, inference: bool = False) -> float:
    """The iteration time with an infinitely fast network and identical workers: the
    forward and backward compute (inference: the forward alone)."""
    if inference:
        return sum(layer.fwd_s for layer in arch.layers)
    return arch.compute_s


def _add_ratios(row: dict[str, Any]) -> None:
    for column, *_ in VARIANTS[1:]:
        row[column + "_vs_tcp"] = row[column + "_s"] / row["tcp_s"]
    # How far the baseline sits above the compute floor: what any scheduler could save.
    row["tcp_over_compute_floor"] = row["tcp_s"] / row["compute_floor_s"] - 1
    row["tcp_random_over_compute_floor"] = row["tcp_random_s"] / row["compute_floor_s"] - 1


def format_table(rows: list[dict[str, Any]]) -> str:
    """A fixed-width table people can read in a terminal."""
    if not rows:
        return "(no rows)"
    shared = "alone_s" in rows[0]
    if shared:
        head = ["model", "Gbit/s", "compute x", "alone s", "TCP/floor-1", "TCP", "TCP/tensor",
                "TCP/random",
                "coflow", "CF prio", "CF deadline"]
        keys = ["tcp_vs_alone", "tcp_per_tensor_vs_alone", "tcp_random_vs_alone",
                "coflow_vs_alone",
                "cadentflow_priority_vs_alone", "cadentflow_deadline_vs_alone"]
    else:
        head = ["workload", "model", "W/PS", "Gbit/s", "compute x", "TCP s", "TCP/floor-1",
                "TCP/tensor", "TCP/random", "coflow", "CF prio", "CF deadline"]
        keys = ["tcp_per_tensor_vs_tcp", "tcp_random_vs_tcp", "coflow_vs_tcp",
                "cadentflow_priority_vs_tcp",
                "cadentflow_deadline_vs_tcp"]
    lines = [head]
    for r in rows:
        if shared:
            cells = [r["model"], f"{r['gbit']:g}", f"{r['compute_scale']:g}",
                     f"{r['alone_s']:.4f}", f"{r['tcp_over_compute_floor']:.3f}"]
        else:
            cells = [r["workload"], r["model"], f"{r['workers']}/{r['ps']}", f"{r['gbit']:g}",
                     f"{r['compute_scale']:g}", f"{r['tcp_s']:.4f}",
                     f"{r['tcp_over_compute_floor']:.3f}"]
        cells += [f"{r[k]:.3f}" for k in keys]
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines)


def toy() -> list[dict[str, Any]]:
    """Fig. 1: node C computes c1 after flow f1, then c2 and c3 after f2 (0.5 s each);
    f1 and f2 are 500 Mb each over one 1 Gbit/s link. As inference of a two-layer model
    (layer 1: f1 then c1; layer 2: f2 then c2 + c3), the completion time is 2 s when f1
    goes first and 2.5 s when both finish together (a coflow-optimal schedule)."""
    megabits = 500e6
    params = int(megabits / 8 / architectures.BYTES_PER_PARAM)
    arch = architectures.Architecture("fig1-toy", (
        architectures.Layer("f1", params, 0, fwd_s=0.5),
        architectures.Layer("f2", params, 0, fwd_s=1.0)), 1, "the paper's Fig. 1")
    rows = []
    for column, policy, tags, tcp in VARIANTS:
        job = engine.Job("fig1", arch, [0], [1], inference=True)
        rows.append({"variant": column, "policy": policy, "tcp_order": tcp,
                     "completion_s": _iteration_s(topology.star(2, 1e9), [job], policy,
                                                  tags, tcp, 0)[0]})
    return rows


def format_headlines() -> str:
    """The paper's numbers its text states (tailcut/papers/data/cadentflow.yaml)."""
    results = papers.get("cadentflow").results
    width = max(len(r.id) for r in results)
    return "\n".join(f"  {r.id.ljust(width)}  {r.paper:g} {r.unit.split(' (')[0]}: {r.what}"
                     for r in results)


def write(rows: list[dict[str, Any]], out: Path, stem: str, text: bool = True) -> None:
    """rows as CSV and JSON under `out`, and (``text``) as format_table's table."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{stem}.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / f"{stem}.json").write_text(json.dumps(rows, indent=1))
    if text:
        (out / f"{stem}.txt").write_text(format_table(rows) + "\n")
