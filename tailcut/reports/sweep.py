"""Plot of a loss-tolerance sweep like the APNet'19 paper's Fig. 2: epochs and JCT against
the loss rate (the paper's p; the fraction lost, not the bounded-loss transport's p).

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

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from tailcut.reports import style


def plot_sweep(sweep_csv: str | Path, table_csv: str | Path, out_png: str | Path) -> Path:
    """Write the Fig. 2-like PNG for every model in ``sweep_csv``; return its path."""
    with open(sweep_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    with open(table_csv, newline="") as f:
        table = {r["model"]: r for r in csv.DictReader(f)}
    if not rows:
        raise ValueError(f"{sweep_csv} has no rows to plot")
    return style.save(draw(rows, table), Path(out_png))


def draw(rows: list[dict[str, str]], table: dict[str, dict[str, str]]) -> Figure:
    """The figure of plot_sweep, from sweep.csv's rows and table3.csv's rows by model,
    not yet written."""
    names = list(dict.fromkeys(r["model"] for r in rows))
    cols = min(len(names), 3)
    nrows = math.ceil(len(names) / cols)
    fig, axes = style.figure(nrows, cols, size=(max(5.2 * cols, 7.0), 3.8 * nrows + 1.0),
                             squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, names, strict=False):
        _panel(ax, [r for r in rows if r["model"] == name], table.get(name, {}))
    style.figure_legend(fig, KEY, [str(mark.get_label()) for mark in KEY])
    style.title(fig, "Loss rate against epochs to target and modelled JCT"
                + _condition(next(iter(table.values()), {})))
    return fig


# The figure's one legend: what each mark of every panel means.
KEY = [
    Patch(color="tab:blue", alpha=0.75, label="epochs to target (median over runs)"),
    Patch(facecolor="none", edgecolor="tab:red", hatch="//",
          label="most runs did not converge"),
    Line2D([], [], marker="o", color="tab:orange", label="modelled JCT"),
    Line2D([], [], color="black", linestyle="--", linewidth=1, label="x1 (loss tolerance)"),
    Line2D([], [], color="black", linestyle=":", linewidth=1,
           label="x2 (convergence bound)"),
]


def _condition(summary: dict[str, str]) -> str:
    """The sweep's condition from a table3.csv row: where the loss was and how the
    runs were made ("" for a row without them)."""
    parts = []
    if summary.get("granularity") and summary.get("direction"):
        parts.append(f"{summary['granularity']} loss on {summary['direction']}")
    if summary.get("workers"):
        parts.append(f"{summary['workers']} workers")
    if summary.get("aggregation"):
        parts.append(f"{summary['aggregation']} aggregation")
    parts.append("emulated BSP")
    if summary.get("runs"):
        parts.append(f"median of {summary['runs']} run(s)")
    return " (" + ", ".join(parts) + ")"


def _panel(ax: Axes, rows: list[dict[str, str]], summary: dict[str, str]) -> None:
    rates = [float(r["loss_rate"]) for r in rows]
    epochs = [float(r["median_epochs"]) for r in rows]
    jct = [float(r["modelled_jct_s"]) for r in rows]
    finite = [e for e in epochs if math.isfinite(e)]
    cap = max(finite + [1.0]) * 1.25
    steps = [b - a for a, b in zip(sorted(rates), sorted(rates)[1:], strict=False) if b > a]
    width = 0.7 * min(steps, default=0.05)
    for x, e in zip(rates, epochs, strict=True):
        if math.isfinite(e):
            ax.bar(x, e, width=width, color="tab:blue", alpha=0.75)
        else:
            ax.bar(x, cap, width=width, color="none", edgecolor="tab:red", hatch="//")
    # The axis ends at the outer bars' edges and is labelled at the loss rates swept
    # only: matplotlib's own ticks ran on below a loss rate of 0.
    ax.set_xlim(min(rates) - 0.6 * width, max(rates) + 0.6 * width)
    style.ticks(ax, "x", rates, [f"{x:g}" for x in rates])
    ax.set_xlabel("loss rate (fraction lost)")
    ax.set_ylabel("epochs to target (epochs)", color="tab:blue")
    ax.set_ylim(0, cap * 1.1)
    ax.grid(alpha=0.3, axis="y")
    ax2 = ax.twinx()
    ok = [(x, j) for x, j in zip(rates, jct, strict=True) if math.isfinite(j)]
    if ok:
        ax2.plot([x for x, _ in ok], [j for _, j in ok], "o-", color="tab:orange")
        ax2.set_ylim(0, max(j for _, j in ok) * 1.3)
    ax2.set_ylabel("modelled JCT (s)", color="tab:orange")
    # x2 is only a lower bound when no loss rate failed (table3.csv's
    # first_failure_loss_rate is empty).
    bounded = summary.get("first_failure_loss_rate", "") != ""
    marks = []
    for key, linestyle in (("x1", "--"), ("x2", ":")):
        value = summary.get(key, "")
        if value != "":
            sign = ">=" if key == "x2" and not bounded else "="
            ax.axvline(float(value), color="black", linestyle=linestyle, linewidth=1)
            marks.append(f"{key} {sign} {float(value):g}")
    paper = summary.get("paper_x1", "")
    if paper:
        marks.append(f"paper's x1 = {paper}")
    style.title(ax, rows[0]["model"] + (f": {', '.join(marks)}" if marks else ""),
                fontsize=10)
