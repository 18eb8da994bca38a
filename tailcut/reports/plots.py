"""Plots of a run's results as PNG files (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from tailcut.reports import condition, style  # style chooses the Agg backend


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

    results = Path(epochs_csv).parent
    fig = draw_loss_vs_epoch(epoch, train_loss, test_loss, accuracy,
                             title or f"Loss and accuracy per epoch ({results.name})",
                             condition.of_results(results))
    return style.save(fig, Path(out_png))


def draw_loss_vs_epoch(epoch: list[int], train_loss: list[float], test_loss: list[float],
                       accuracy: list[float], title: str, subtitle: str = "") -> Figure:
    """The figure of plot_loss_vs_epoch, not yet written; `subtitle` is the run's
    condition (tailcut.reports.condition)."""
    fig, ax_loss = style.figure()
    try:
        ax_loss.plot(epoch, train_loss, "o-", color="tab:blue", label="train loss")
        ax_loss.plot(epoch, test_loss, "s-", color="tab:orange", label="test loss")
        ax_loss.set_xlabel("epoch")
        ax_loss.set_ylabel("cross-entropy loss (nats)")
        ax_loss.set_ylim(bottom=0)
        ax_loss.grid(alpha=0.3)
        ax_acc = ax_loss.twinx()
        ax_acc.plot(epoch, accuracy, "^--", color="tab:green", label="test accuracy")
        ax_acc.set_ylabel("test accuracy (fraction correct)")
        ax_acc.set_ylim(0, 1)
        ax_loss.xaxis.set_major_locator(MaxNLocator(integer=True))   # no epoch 2.5
        # One legend for both axes, so a reader sees which line belongs to which.
        lines = ax_loss.get_lines() + ax_acc.get_lines()
        style.legend(ax_loss, lines, [str(line.get_label()) for line in lines])
        style.title(fig, title, subtitle=subtitle)
    except BaseException:
        plt.close(fig)
        raise
    return fig
