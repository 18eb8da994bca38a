"""IMC'20, PS communication latency: the per-RPC dissection of a sparse model with 1 PS
and 8 workers on the testbed (Fig. 4 latency CDFs, Fig. 5 per-part breakdown, Fig. 7(b)
concurrent connections, Fig. 10 hot parameters), next to the numbers the paper prints.

Every number of ours is the median over the runs (seeds) of the full version; --quick
runs one seed for a fixed number of iterations."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from tailcut import errors, spec
from tailcut.reproduce import jobs
from tailcut.reproduce.measure import (Figure, Files, Measured, Value, markdown_table,
                                       number)
from tailcut.reproduce.steps import Step

SEEDS_FULL = (0, 1, 2)
QUICK_ITERATIONS = 150
PARTS = ("w_proc_us", "w_queue_us", "ps_queue_us", "ps_sync_us", "ps_proc_us", "n_tx_us")


def _job(seed: int, quick: bool) -> jobs.Raw:
    """examples/dissection-8w.yaml: the paper's setting scaled to this host."""
    raw = jobs.two_racks(f"repro-imc20-s{seed}", model="sparse", workers=8,
                         target_accuracy=0.68, epochs=20, learning_rate=0.5)
    raw["spec"]["training"].update({"seed": seed, "timeoutS": 120})
    return jobs.capped(raw, QUICK_ITERATIONS) if quick else raw


def _results(seed: int) -> str:
    return f"steps/run-s{seed}/results"


def steps(quick: bool) -> list[Step]:
    seeds = (0,) if quick else SEEDS_FULL
    return [Step(f"run-s{seed}", f"sparse model, 1 PS + 8 workers over tcp, seed {seed} "
                                 f"(the RPC dissection)",
                 ("run", "{job}", "--results-dir", "{out}/results"),
                 estimate_s=20 if quick else 55, job=jobs.render(_job(seed, quick)),
                 needs_root=True, ok_exit_codes=(0, errors.EXIT_TARGET_NOT_REACHED),
                 outputs=("results/metrics.json",))
            for seed in seeds]


# The paper's hot set, 20,000 parameters, as a fraction of its models (Table 1).
HOT = 20_000
PAPER_PARAMS = {"min": 0.9e6, "max": 150e6}   # R1 (recommendation), R2 (search)


def _hot_share(results: Path, fraction: float) -> Optional[float]:
    """Percent of all updates taken by the top ``fraction`` of our parameters."""
    from tailcut.reports import dissection
    try:
        counts = dissection.update_counts(results)
    except (OSError, ValueError):
        return None
    k = max(1, round(fraction * counts.size))
    return 100 * dissection.top_k_shares(counts, (k,))[k]


def _hot_reading(files: Files, fraction: float) -> "Reading":
    def read(d: dict[str, Any], path: str) -> Optional[float]:
        return _hot_share(files.path(path), fraction)
    return read


def measure(files: Files, quick: bool) -> Measured:
    m = Measured()
    seeds = (0,) if quick else SEEDS_FULL
    runs = [(_results(s), files.json(f"{_results(s)}/dissection.json")) for s in seeds]
    runs = [(path, d) for path, d in runs if d]
    across = f"median over {len(runs)} run(s) ({', '.join(p for p, _ in runs)})"

    def median_of(key: str, get: Reading, how: str, note: str = "") -> None:
        values = [v for path, d in runs if (v := get(d, path)) is not None]
        m.values[key] = Value(statistics.median(values) if values else None,
                              f"{how}; {across}", note)

    for end, params in PAPER_PARAMS.items():
        fraction = HOT / params
        median_of(f"hot.top20k-share.{end}", _hot_reading(files, fraction),
                  f"updates-ps-*.npz: percent of updates to the top {100 * fraction:.3g}% "
                  f"of parameters (20,000 of {params / 1e6:g} m in the paper), "
                  f"dissection.top_k_shares", "scale-matched")
    median_of("conn.per-ps-1ms.min", _connections("median"),
              "dissection.json: concurrent_connections.ps-0.median (windows with a client)")
    median_of("conn.per-ps-1ms.max", _connections("max"),
              "dissection.json: concurrent_connections.ps-0.max")

    def arithmetic(d: dict[str, Any], path: str) -> Optional[float]:
        push, pull = d["push"]["mean_us"]["ps_proc_us"], d["pull"]["mean_us"]["ps_proc_us"]
        return 100 * (push - pull) / push if push else None
    median_of("ps-proc.arith-share.push.max", arithmetic,
              "dissection.json: 100 x (push.mean_us.ps_proc_us - pull.mean_us.ps_proc_us) / "
              "push.mean_us.ps_proc_us (the paper's estimate)")
    median_of("rpc.request-bytes.min", lambda d, p: number(d["pull"]["request_bytes_median"]),
              "dissection.json: pull.request_bytes_median (the smallest request)")
    median_of("rpc.request-bytes.max", lambda d, p: number(d["push"]["request_bytes_median"]),
              "dissection.json: push.request_bytes_median (the largest request)")
    median_of("latency.push-spike.r2", lambda d, p: number(d["push"]["p99_us"]),
              "dissection.json: push.p99_us (no spike found by tailcut; its push tail)")
    median_of("dataset.rpc-logs",
              lambda d, p: float(d["rpcs"]["push"] + d["rpcs"]["pull"]) / 1e6,
              "dissection.json: (rpcs.push + rpcs.pull) / 1e6")
    for model in ("r1", "r2"):
        median_of(f"model.params.{model}", _millions_of_params,
                  "dissection.json: hot_parameters.num_params / 1e6")
    if runs:
        first = runs[0][0]
        metrics = files.json(f"{first}/metrics.json") or {}
        job_yaml = first.removesuffix("/results") + "/job.yaml"
        job = spec.load_file(files.path(job_yaml)).spec
        m.values["setup.workers"] = Value(float(job.replicas.workers),
                                          f"{job_yaml}: spec.replicas.workers")
        m.values["setup.ps-nodes"] = files.json_value(f"{first}/metrics.json",
                                                      "parameter_servers")
        m.values["setup.link-gbit"] = Value(job.network.access_link.bandwidth / 1e9,
                                            f"{job_yaml}: spec.network.accessLink.bandwidth")
        for png, caption, label in (
                ("rpc_latency_cdf.png", "Push and pull RPC latency CDFs", "Fig. 4"),
                ("rpc_breakdown.png", "Where an RPC's time goes, per part", "Fig. 5"),
                ("concurrent_connections.png", "Connections to the PS per 1,000 us",
                 "Fig. 7(b)"),
                ("hot_parameters.png", "Share of updates taken by the top-k parameters",
                 "Fig. 10")):
            m.figures.append(Figure(f"{first}/{png}", f"{caption} (seed {seeds[0]})", label))
        m.tables.append(_breakdown(runs))
        m.notes.append(_orderings(runs, metrics))
    m.notes += [
        "The paper's applications are Alibaba's: R1 (0.9 m parameters) and R2 (150 m) on 80 "
        "workers and 20 PS at 10 Gbit/s; ours is a 92 k-parameter click model with Zipf(1.1) "
        "ids, 8 workers and 1 PS at 1 Gbit/s on 2 cores. The setup rows show the gap.",
        "A tailcut push carries the whole dense gradient in one message (no segmentation), "
        "and in BSP a pull waits at the barrier (PS_sync, a part the paper does not have).",
    ]
    return m


Reading = Callable[[dict[str, Any], str], Optional[float]]


def _connections(key: str) -> Reading:
    def read(d: dict[str, Any], path: str) -> Optional[float]:
        return number(d["concurrent_connections"].get("ps-0", {}).get(key))
    return read


def _millions_of_params(d: dict[str, Any], path: str) -> Optional[float]:
    return float(d["hot_parameters"]["num_params"]) / 1e6


def _breakdown(runs: list[tuple[str, dict[str, Any]]]) -> tuple[str, str]:
    rows = []
    for op in ("push", "pull"):
        means = {part: statistics.median(d[op]["mean_us"][part] for _, d in runs)
                 for part in PARTS}
        total = sum(means.values())
        median = statistics.median(d[op]["median_us"] for _, d in runs)
        p99 = statistics.median(d[op]["p99_us"] for _, d in runs)
        row: dict[str, Any] = {"RPC": op, "median us": f"{median:.0f}", "p99 us": f"{p99:.0f}"}
        row.update({part: f"{means[part]:.0f} ({100 * means[part] / total:.0f}%)"
                    for part in PARTS})
        rows.append(row)
    return ("Fig. 5: mean microseconds per part (share of the RPC), medians over runs",
            markdown_table(rows, ("RPC", "median us", "p99 us", *PARTS)))


def _orderings(runs: list[tuple[str, dict[str, Any]]], metrics: dict[str, Any]) -> str:
    """The paper's qualitative findings, checked on ours."""
    d = runs[0][1]
    push, pull = d["push"], d["pull"]
    checks = [
        ("push latency above pull (Fig. 4)", push["median_us"] > pull["median_us"]),
        ("pull responses larger than push responses (Fig. 6)",
         pull["response_bytes_median"] > push["response_bytes_median"]),
        ("PS_proc larger in push than in pull (§3.2)",
         push["mean_us"]["ps_proc_us"] > pull["mean_us"]["ps_proc_us"]),
    ]
    said = "; ".join(f"{text}: {'yes' if ok else 'no'}" for text, ok in checks)
    return (f"The paper's orderings, on our first run: {said}. (Pull waits at the BSP "
            f"barrier here, so pull latency can exceed push.)")
