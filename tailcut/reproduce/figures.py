"""The report's own plots (PNG, matplotlib Agg): how far each of our numbers is from the
paper's, and CDFs drawn from several steps' raw files."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.figure import Figure

from tailcut.reports import style


def ratios(labels: Sequence[str], values: Sequence[float], path: Path, title: str) -> Path:
    """Horizontal bars of ours / paper on a log axis, 1 marked: one bar per number."""
    return style.save(draw_ratios(labels, values, title), path)


def draw_ratios(labels: Sequence[str], values: Sequence[float], title: str) -> Figure:
    fig, ax = style.figure(size=(8, 0.35 * len(labels) + 1.8))
    ys = range(len(labels))
    shown = [max(v, 1e-3) for v in values]   # a 0 (a tie against a gain) on a log axis
    ax.barh(list(ys), [v - 1 for v in shown], left=1.0,   # from 1: above or below it
            color=["tab:green" if 0.8 <= v <= 1.25 else "tab:orange" for v in values])
    ax.axvline(1.0, color="black", linewidth=1)
    style.log_scale(ax, "x")
    ax.set_yticks(list(ys), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ours / paper (ratio, log scale; green within 0.8-1.25)")
    ax.set_ylabel("number compared")
    style.title(fig, title)
    ax.grid(axis="x", alpha=0.3, which="both")
    return fig


def cdf(series: Mapping[str, Sequence[float]], path: Path, title: str, xlabel: str,
        log_x: bool = True) -> Path:
    """Empirical CDFs of several samples on one axis; `xlabel` names the quantity and
    its unit, as "push completion time (s)"."""
    return style.save(draw_cdf(series, title, xlabel, log_x), path)


def draw_cdf(series: Mapping[str, Sequence[float]], title: str, xlabel: str,
             log_x: bool = True) -> Figure:
    fig, ax = style.figure()
    for label, values in series.items():
        xs = sorted(v for v in values if math.isfinite(v) and (v > 0 or not log_x))
        if xs:
            ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=label)
    if log_x:
        style.log_scale(ax, "x")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("CDF (fraction of samples)")
    ax.set_ylim(0, 1.02)
    style.title(fig, title)
    ax.grid(alpha=0.3)
    if ax.get_lines():
        style.legend(ax)
    return fig


def grouped_bars(groups: Sequence[str], series: Mapping[str, Sequence[float]], path: Path,
                 title: str, ylabel: str, reference: float | None = None,
                 xlabel: str = "model") -> Path:
    """One group of bars per label (a model), one bar per series (a policy)."""
    return style.save(draw_grouped_bars(groups, series, title, ylabel, reference, xlabel),
                      path)


def draw_grouped_bars(groups: Sequence[str], series: Mapping[str, Sequence[float]],
                      title: str, ylabel: str, reference: float | None = None,
                      xlabel: str = "model") -> Figure:
    fig, ax = style.figure(size=(max(7, 1.6 * len(groups)), 4.5))
    width = 0.8 / max(1, len(series))
    for k, (label, values) in enumerate(series.items()):
        ax.bar([i + k * width for i in range(len(groups))], values, width, label=label)
    # 1.6 inches a group: room for a label of ~20 characters at 8 points
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], groups, fontsize=8)
    if reference is not None:
        ax.axhline(reference, color="black", linewidth=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    style.title(fig, title)
    ax.grid(axis="y", alpha=0.3)
    style.legend(ax)
    return fig
