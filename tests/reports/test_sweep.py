"""Tests of the Fig. 2-like sweep plot."""

import csv
from pathlib import Path

import pytest

from tailcut.reports import sweep as sweep_plot
from tailcut.training import sweep


def _write(path: Path, fields: tuple[str, ...], rows: list[dict[str, object]]) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_plot_has_a_panel_per_model_and_draws_runs_that_never_converged(tmp_path: Path) -> None:
    rows = []
    for model, epochs in (("mlp", [3, 3, 4, "inf"]), ("rnn", [7, 7, 8, 9])):
        for i, e in enumerate(epochs):
            rows.append({"model": model, "loss_rate": i * 0.05, "median_epochs": e,
                         "modelled_jct_s": "inf" if e == "inf" else 2.0 + i})
    points = _write(tmp_path / "sweep.csv", sweep.POINT_FIELDS, rows)
    table = _write(tmp_path / "table3.csv", sweep.TABLE_FIELDS, [
        {"model": "mlp", "x1": 0.05, "x2": 0.1, "paper_x1": 0.15},
        {"model": "rnn", "x1": 0.05, "x2": 0.15, "paper_x1": 0.1},
    ])
    png = sweep_plot.plot_sweep(points, table, tmp_path / "fig2.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_an_empty_sweep_is_refused_with_the_file_named(tmp_path: Path) -> None:
    points = _write(tmp_path / "sweep.csv", sweep.POINT_FIELDS, [])
    table = _write(tmp_path / "table3.csv", sweep.TABLE_FIELDS, [])
    with pytest.raises(ValueError, match="sweep.csv has no rows"):
        sweep_plot.plot_sweep(points, table, tmp_path / "fig2.png")
