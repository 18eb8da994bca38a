"""Plots of a run's results as PNG files (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: pods and CI have no display

import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend
from matplotlib.figure import Figure  # noqa: E402

# Margins (fractions of the figure) fixed for our 7 x 4.5 inch figures, with room for
# axis labels on both sides. tight_layout measured every tick label's text to find
# them, about half of the time a run spent drawing its plots.
MARGINS = {"left": 0.1, "right": 0.9, "bottom": 0.11, "top": 0.93}


def log_scale(ax: Any, which: str) -> None:
    """A log scale on axes ``ax``'s ``which`` axis ("x" or "y"), labelled with plain
    numbers ("0.1", "10", "1000"): matplotlib's default labels are mathtext ($10^{2}$),
    whose parser cost about 0.3 s of the report's CPU the first time it ran."""
    from matplotlib.ticker import FuncFormatter
    getattr(ax, f"set_{which}scale")("log")
    axis = getattr(ax, f"{which}axis")
    axis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    axis.set_minor_formatter(FuncFormatter(_two_and_five))


def _two_and_five(value: float, _pos: int) -> str:
    """Minor log ticks: label the 2s and 5s of each decade (1, 2, 5, 10, 20, 50, ...)."""
    if value <= 0:
        return ""
    leading = value / 10 ** math.floor(math.log10(value))
    return f"{value:g}" if round(leading) in (2, 5) else ""


def save(fig: "Figure", path: Path) -> Path:
    """Write `fig` to `path` (with fixed margins) and free it."""
    try:
        fig.subplots_adjust(**MARGINS)
        path.parent.mkdir(parents=True, exist_ok=True)
        # zlib level 1: ~9 ms a figure to encode instead of ~14 (level 6), files ~1.15x larger
        fig.savefig(path, pil_kwargs={"compress_level": 1})
    finally:
        plt.close(fig)
    return path


def plot_loss_vs_epoch(
    epochs_csv: str | Path, out_png: str | Path, title: str | None = None
) -> Path:
    """Train and test loss per epoch, with test accuracy on a second y axis.

    ``epochs_csv`` is the PS's epochs.csv (columns epoch, train_loss, test_loss,
    test_accuracy, ...). Returns the path of the PNG written.
    """
    with open(epochs_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{epochs_csv} has no epochs to plot (did the job finish one epoch?)")
    epoch = [int(r["epoch"]) for r in rows]
    train_loss = [float(r["train_loss"]) for r in rows]
    test_loss = [float(r["test_loss"]) for r in rows]
    accuracy = [float(r["test_accuracy"]) for r in rows]

    fig, ax_loss = plt.subplots(figsize=(7, 4.5), dpi=100)
    try:
        ax_loss.plot(epoch, train_loss, "o-", color="tab:blue", label="train loss")
        ax_loss.plot(epoch, test_loss, "s-", color="tab:orange", label="test loss")
        ax_loss.set_xlabel("epoch")
        ax_loss.set_ylabel("cross-entropy loss")
        ax_loss.set_ylim(bottom=0)
        ax_loss.grid(alpha=0.3)
        ax_acc = ax_loss.twinx()
        ax_acc.plot(epoch, accuracy, "^--", color="tab:green", label="test accuracy")
        ax_acc.set_ylabel("test accuracy")
        ax_acc.set_ylim(0, 1)
        # One legend for both axes, so a reader sees which line belongs to which.
        lines = ax_loss.get_lines() + ax_acc.get_lines()
        ax_loss.legend(lines, [str(line.get_label()) for line in lines], loc="center right")
        if len(epoch) <= 20:
            ax_loss.set_xticks(epoch)
        ax_loss.set_title(title or f"Loss and accuracy per epoch ({Path(epochs_csv).parent.name})")
    except BaseException:
        plt.close(fig)
        raise
    return save(fig, Path(out_png))
