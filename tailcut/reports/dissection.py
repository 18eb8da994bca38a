"""The IMC'20 per-RPC dissection report: latency CDFs, breakdown bars, connections, hot parameters.

From a results directory's RPC stamps, connection counts and per-parameter update
counts (written by the PS, workers and aggregators) it makes the paper's figures:

- ``rpc_latency_cdf.png``: CDF of push and pull latency (their Fig. 4);
- ``rpc_breakdown.png``: mean W_proc, W_queue, PS_proc, PS_queue, N_tx (and our
  PS_sync, the bsp/ssp hold) of push and pull, stacked (their Fig. 5);
- ``concurrent_connections.png``: CDF over time windows of the distinct clients
  each PS heard from (their Fig. 7b);
- ``hot_parameters.png``: share of all updates taken by the top-k parameters
  (their Fig. 10);

and ``dissection.json`` with the numbers behind them.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from tailcut.reports import condition, style, thin
from tailcut.training import rpc

# The parts of an RPC's time, in the order they are stacked (bottom first), named for
# a reader with the IMC'20 paper's symbol after each (our PS_sync is not theirs).
PART_LABELS = {
    "n_tx_us": "network transfer, both ways (N_tx)",
    "ps_queue_us": "request queued at the PS (PS_queue)",
    "ps_sync_us": "PS waits for the barrier or staleness bound (PS_sync)",
    "ps_proc_us": "PS processes the request (PS_proc)",
    "w_queue_us": "reply queued at the worker (W_queue)",
    "w_proc_us": "worker processes the reply (W_proc)",
}
TOP_K = (1, 10, 100, 1000, 10000, 100000)


def top_k_shares(counts: np.ndarray, ks: tuple[int, ...] = TOP_K) -> dict[int, float]:
    """Share of all updates taken by the k most-updated parameters, for each k <= size."""
    total = float(counts.sum())
    ordered = np.sort(counts)[::-1]
    cumulative = np.cumsum(ordered, dtype=np.float64)
    return {k: (float(cumulative[k - 1]) / total if total else 0.0)
            for k in ks if k <= counts.size}


def update_counts(results_dir: Path) -> np.ndarray:
    """Per-parameter update counts of the whole model, from every shard's updates-ps-*.npz.

    When ps-0 left none (it was killed and the replica took over), the replica's
    counts stand in: it applied every update of the job.
    """
    paths = sorted(results_dir.glob("updates-ps-*.npz"))
    if not (results_dir / "updates-ps-0.npz").exists():
        paths = sorted(results_dir.glob("updates-replica-0.npz"))
    parts = []
    for path in paths:
        with np.load(path) as z:
            parts.append((int(z["lo"]), z["counts"]))
    if not parts:
        raise ValueError(f"{results_dir} has no updates-*.npz (no PS finished?)")
    parts.sort(key=lambda p: p[0])
    counts = np.concatenate([c for _, c in parts])
    tor = tor_counts(results_dir)
    if tor is not None:   # the hot parameters were updated in the ToR, not at the PS
        index, served = tor
        counts[index] += served
    return counts


def tor_counts(results_dir: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """The ToR store's (indices, update counts) of its hot parameters, if it held any."""
    path = results_dir / "updates-tor.npz"
    if not path.exists():
        return None
    with np.load(path) as z:
        return z["index"], z["counts"]


def _connections(results_dir: Path) -> dict[str, list[int]]:
    out = {}
    for path in sorted(results_dir.glob("connections-*.csv")):
        with open(path, newline="") as f:
            active = [int(r["active_connections"]) for r in csv.DictReader(f)]
        out[path.stem.removeprefix("connections-")] = [a for a in active if a > 0]
    return out


def report(results_dir: str | Path, title: str = "") -> list[Path]:
    """Write rpcs.csv, dissection.json and the four PNGs; return the paths written."""
    return write_summary(results_dir, [part(results_dir, title) for part in PARTS])


def rpc_figures(results_dir: str | Path, title: str = "") -> tuple[list[Path], dict[str, Any]]:
    """rpcs.csv, the latency CDF and the breakdown: the paths written and their numbers
    (one half of the report: PARTS can be drawn in two processes at once)."""
    results = Path(results_dir)
    rows = rpc.dissect(results)
    if not rows:
        raise ValueError(f"{results} has no RPCs to dissect (rpc-*.csv missing or empty)")
    by_op = {op: [r for r in rows if r["op"] == op] for op in ("push", "pull")}
    summary: dict[str, Any] = {"rpcs": {op: len(rs) for op, rs in by_op.items()}}
    for op, rs in by_op.items():
        if rs:
            total = np.array([r["total_us"] for r in rs], dtype=float)
            summary[op] = {
                "median_us": float(np.median(total)), "p99_us": float(np.percentile(total, 99)),
                "mean_us": {k: float(np.mean([r[k] for r in rs])) for k in PART_LABELS},
                "request_bytes_median": float(np.median([r["request_bytes"] for r in rs])),
                "response_bytes_median": float(np.median([r["response_bytes"] for r in rs])),
            }
    written = [results / "rpcs.csv"]
    latencies = {op: np.array([r["total_us"] for r in rs], dtype=float) / 1e3
                 for op, rs in by_op.items() if rs}
    run = condition.of_results(results)
    written.append(style.save(draw_latency_cdf(latencies, title, run),
                              results / "rpc_latency_cdf.png"))
    means = {op: summary[op]["mean_us"] for op in latencies}
    written.append(style.save(draw_breakdown(means, title, run),
                              results / "rpc_breakdown.png"))
    return written, summary


def server_figures(results_dir: str | Path, title: str = ""
                   ) -> tuple[list[Path], dict[str, Any]]:
    """The concurrent connections and the hot parameters: the paths written and their
    numbers (the report's other half)."""
    results = Path(results_dir)
    written = []
    summary: dict[str, Any] = {}
    conns = _connections(results)
    summary["concurrent_connections"] = {
        name: {"windows": len(a), "median": float(np.median(a)) if a else 0.0,
               "max": max(a, default=0)} for name, a in conns.items()}
    run = condition.of_results(results)
    written.append(style.save(draw_connections(conns, title, run),
                              results / "concurrent_connections.png"))

    counts = update_counts(results)
    shares = top_k_shares(counts)
    summary["hot_parameters"] = {
        "num_params": int(counts.size), "updates": int(counts.sum()),
        "never_updated": int(np.count_nonzero(counts == 0)),
        "top_k_share": {str(k): v for k, v in shares.items()},
    }
    tor = tor_counts(results)
    if tor is not None:
        summary["hot_parameters"]["served_by_tor"] = (
            float(tor[1].sum()) / float(counts.sum()) if counts.sum() else 0.0)
        summary["hot_parameters"]["tor_parameters"] = int(tor[0].size)
    written.append(style.save(draw_hot_parameters(counts, title, run),
                              results / "hot_parameters.png"))
    return written, summary


PARTS = (rpc_figures, server_figures)


def write_summary(results_dir: str | Path,
                  parts: list[tuple[list[Path], dict[str, Any]]]) -> list[Path]:
    """dissection.json from the PARTS' numbers; every path written, it last."""
    path = Path(results_dir) / "dissection.json"
    summary = {key: value for _, numbers in parts for key, value in numbers.items()}
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return [*(p for written, _ in parts for p in written), path]


def draw_latency_cdf(latencies_ms: dict[str, np.ndarray], title: str = "",
                     subtitle: str = "") -> Figure:
    """rpc_latency_cdf.png: the CDF of each op's RPC latencies (ms), not yet written;
    `subtitle` is the run's condition (tailcut.reports.condition), as for the others."""
    fig, ax = style.figure()
    for op, values in latencies_ms.items():
        x, y = thin.cdf(values)
        ax.plot(x, y, label=f"{op} ({values.size} RPCs)")
    style.log_scale(ax, "x")
    ax.set_xlabel("RPC latency (ms, log scale)")
    ax.set_ylabel("CDF (fraction of RPCs)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    style.legend(ax)
    style.title(fig, style.titled(title, "push and pull RPC latency"), subtitle=subtitle)
    return fig


def draw_breakdown(means_us: dict[str, dict[str, float]], title: str = "",
                   subtitle: str = "") -> Figure:
    """rpc_breakdown.png: each op's mean time per RPC (us) in PART_LABELS' parts,
    stacked, not yet written."""
    fig, ax = style.figure(size=(7, 5.5))   # its legend (a line a part) goes below
    ops = list(means_us)
    bottom = np.zeros(len(ops))
    for key, label in PART_LABELS.items():
        part = np.array([max(means_us[op][key], 0.0) / 1e3 for op in ops])
        ax.bar(ops, part, width=0.5, bottom=bottom, label=label)
        bottom += part
    ax.set_xlabel("RPC")
    ax.set_ylabel("mean time per RPC (ms)")
    ax.set_xlim(-0.6, len(ops) - 0.4)
    ax.grid(alpha=0.3, axis="y")
    handles, labels = ax.get_legend_handles_labels()
    style.legend(ax, handles[::-1], labels[::-1])   # listed top first, as stacked
    style.title(fig, style.titled(title, "where an RPC's time goes (means)"),
                subtitle=subtitle)
    return fig


def draw_connections(conns: dict[str, list[int]], title: str = "",
                     subtitle: str = "") -> Figure:
    """concurrent_connections.png: the CDF of each PS's distinct clients per window
    with traffic, not yet written."""
    fig, ax = style.figure()
    for name, active in conns.items():
        if active:
            x, y = thin.cdf(active)
            ax.step(x, y, where="post", label=name)
    counts = [c for active in conns.values() for c in active]
    if counts:   # a half-client margin: the steps at the ends stay off the axes' frame
        ax.set_xlim(min(counts) - 0.5, max(counts) + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))   # clients come whole
    ax.set_xlabel("distinct clients heard from per window (connections)")
    ax.set_ylabel("CDF (fraction of windows with traffic)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    if any(conns.values()):
        style.legend(ax)
    style.title(fig, style.titled(title, "concurrent connections per PS"),
                subtitle=subtitle)
    return fig


def draw_hot_parameters(counts: np.ndarray, title: str = "",
                        subtitle: str = "") -> Figure:
    """hot_parameters.png: the share of all updates the top-k parameters took, against
    k on a log axis, not yet written."""
    fig, ax = style.figure()
    ordered = np.sort(counts)[::-1]
    if ordered.sum() > 0:
        cumulative = np.cumsum(ordered, dtype=np.float64) / ordered.sum()
        drawn = thin.log_spaced(ordered.size)   # a log axis: every k is ~10^5 points
        ks = drawn + 1
        ax.plot(ks, cumulative[drawn], color="tab:blue", label="measured")
        ax.plot(ks, ks / ordered.size, "--", color="gray",
                label="if every parameter were updated equally often")
        shares = top_k_shares(counts)
        ax.plot(list(shares), list(shares.values()), "o", color="tab:red",
                label=f"top k's share (top 1: {shares[1]:.0%})")
        # Each share above and left of its point: the curves rise to the right, so
        # nothing is drawn there. Top 1's sits on the axis's edge: it is in the legend.
        for k, share in shares.items():
            if k > 1:
                ax.annotate(f"top {k}: {share:.0%}", (k, share), fontsize=8, ha="right",
                            textcoords="offset points", xytext=(-3, 5))
    style.log_scale(ax, "x")
    ax.set_xlim(1, max(counts.size, 10))
    ax.set_xlabel(f"k, the most-updated parameters counted (parameters, of {counts.size:,})")
    ax.set_ylabel("share of all parameter updates (fraction)")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    if ordered.sum() > 0:
        style.legend(ax)
    style.title(fig, style.titled(title, "hot parameters: updates taken by the top k"),
                subtitle=subtitle)
    return fig
