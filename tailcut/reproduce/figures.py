"""The report's own plots (PNG, matplotlib Agg): how far each of our numbers is from the
paper's, and CDFs drawn from several steps' raw files."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless

import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend


def ratios(labels: Sequence[str], values: Sequence[float], path: Path, title: str) -> Path:
    """Horizontal bars of ours / paper on a log axis, 1 marked: one bar per number."""
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(labels) + 1.5), dpi=100)
    try:
        ys = range(len(labels))
        shown = [max(v, 1e-3) for v in values]   # a 0 (a tie against a gain) on a log axis
        ax.barh(list(ys), [v - 1 for v in shown], left=1.0,   # from 1: above or below it
                color=["tab:green" if 0.8 <= v <= 1.25 else "tab:orange" for v in values])
        ax.axvline(1.0, color="black", linewidth=1)
        ax.set_xscale("log")
        ax.set_yticks(list(ys), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("ours / paper (log scale; green within 0.8-1.25)")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3, which="both")
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path


def cdf(series: Mapping[str, Sequence[float]], path: Path, title: str, xlabel: str,
        log_x: bool = True) -> Path:
    """Empirical CDFs of several samples on one axis."""
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    try:
        for label, values in series.items():
            xs = sorted(v for v in values if math.isfinite(v) and (v > 0 or not log_x))
            if xs:
                ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=label)
        if log_x:
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("CDF")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path


def grouped_bars(groups: Sequence[str], series: Mapping[str, Sequence[float]], path: Path,
                 title: str, ylabel: str, reference: float | None = None) -> Path:
    """One group of bars per label (a model), one bar per series (a policy)."""
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups)), 4.5), dpi=100)
    try:
        width = 0.8 / max(1, len(series))
        for k, (label, values) in enumerate(series.items()):
            ax.bar([i + k * width for i in range(len(groups))], values, width, label=label)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], groups, fontsize=8)
        if reference is not None:
            ax.axhline(reference, color="black", linewidth=1)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path
