"""Plot of a loss-tolerance sweep like the APNet'19 paper's Fig. 2: epochs and JCT against p.

Reads the sweep.csv that ``tailcut sweep`` writes (one row per model and loss
rate) and table3.csv (x1 and x2 per model); draws one panel per model with the
median epochs to the target (bars, left axis) and the modelled JCT (line, right
axis), and marks x1 and x2. A loss rate at which most runs did not converge is
drawn as a hatched bar at the epoch limit.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display needed

import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend
from matplotlib.axes import Axes  # noqa: E402


def plot_sweep(sweep_csv: str | Path, table_csv: str | Path, out_png: str | Path) -> Path:
    """Write the Fig. 2-like PNG for every model in ``sweep_csv``; return its path."""
    with open(sweep_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    with open(table_csv, newline="") as f:
        table = {r["model"]: r for r in csv.DictReader(f)}
    if not rows:
        raise ValueError(f"{sweep_csv} has no rows to plot")
    names = list(dict.fromkeys(r["model"] for r in rows))
    cols = min(len(names), 3)
    nrows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.8 * nrows), dpi=100,
                             squeeze=False)
    try:
        for ax in axes.flat[len(names):]:
            ax.set_visible(False)
        for ax, name in zip(axes.flat, names, strict=False):
            _panel(ax, [r for r in rows if r["model"] == name], table.get(name, {}))
        fig.suptitle("Impact of gradient/parameter loss on convergence and JCT "
                     "(emulated BSP, medians over runs)")
        fig.tight_layout()
        out = Path(out_png)
        fig.savefig(out)
    finally:
        plt.close(fig)
    return out


def _panel(ax: Axes, rows: list[dict[str, str]], summary: dict[str, str]) -> None:
    p = [float(r["p"]) for r in rows]
    epochs = [float(r["median_epochs"]) for r in rows]
    jct = [float(r["modelled_jct_s"]) for r in rows]
    finite = [e for e in epochs if math.isfinite(e)]
    cap = max(finite + [1.0]) * 1.25
    width = 0.035 if len(p) < 2 else 0.7 * (p[1] - p[0])
    for x, e in zip(p, epochs, strict=True):
        if math.isfinite(e):
            ax.bar(x, e, width=width, color="tab:blue", alpha=0.75)
        else:
            ax.bar(x, cap, width=width, color="none", edgecolor="tab:red", hatch="//")
    ax.set_xlabel("loss rate p")
    ax.set_ylabel("epochs to target (median)", color="tab:blue")
    ax.set_ylim(0, cap * 1.1)
    ax.grid(alpha=0.3, axis="y")
    ax2 = ax.twinx()
    ok = [(x, j) for x, j in zip(p, jct, strict=True) if math.isfinite(j)]
    if ok:
        ax2.plot([x for x, _ in ok], [j for _, j in ok], "o-", color="tab:orange",
                 label="modelled JCT")
        ax2.set_ylim(0, max(j for _, j in ok) * 1.3)
    ax2.set_ylabel("modelled JCT (s)", color="tab:orange")
    # x2 is only a lower bound when no p failed (table3.csv's first_failure_p is empty).
    bounded = summary.get("first_failure_p", "") != ""
    for key, style in (("x1", "--"), ("x2", ":")):
        value = summary.get(key, "")
        if value != "":
            sign = ">=" if key == "x2" and not bounded else "="
            ax.axvline(float(value), color="black", linestyle=style, linewidth=1)
            ax.text(float(value), cap * 1.05, f" {key}{sign}{float(value):.2f}", fontsize=8)
    name = rows[0]["model"]
    paper = summary.get("paper_x1", "")
    ax.set_title(f"{name}" + (f" (paper x1 = {paper})" if paper else ""))
