"""A run's condition in its figures' titles, read from the spec.yaml it left."""

from __future__ import annotations

import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure

from tailcut.reports import condition, plots, style
from tailcut.spec import load

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("example, expected", [
    ("quickstart-background.yaml",
     "mlp, 4 workers, tcp; links 500 Mbit/s; background 0.5 on uplink/rack-1"),
    ("bounded-loss.yaml", "mlp, 4 workers, bounded-loss p=0.9; access links 1 Gbit/s, "
                          "1% loss, uplinks 1 Gbit/s"),
    ("incast.yaml", "mlp, 8 workers, tcp; links 1 Gbit/s, 85 KB buffers"),
    ("cadentflow.yaml", "deep-mlp, 4 workers, tcp; access links 200 Mbit/s, uplinks "
                        "1 Gbit/s; scheduling cadentflow"),
    ("sharded-ssp.yaml", "mlp, 4 workers, ssp, tcp; links 1 Gbit/s"),
])
def test_a_condition_names_what_a_reader_needs_to_compare_two_runs(
        example: str, expected: str) -> None:
    assert condition.describe(load.load_file(EXAMPLES / example)) == expected


def test_a_results_directory_without_a_spec_has_no_condition(tmp_path: Path) -> None:
    assert condition.of_results(tmp_path) == ""
    (tmp_path / "spec.yaml").write_text("kind: NotAJob\n")
    assert condition.of_results(tmp_path) == ""


def test_the_loss_plot_of_a_run_carries_its_condition_under_its_title(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copy(EXAMPLES / "bounded-loss.yaml", tmp_path / "spec.yaml")
    (tmp_path / "epochs.csv").write_text(
        "epoch,iteration,train_loss,test_loss,test_accuracy,elapsed_s\n"
        "1,63,2.05,2.06,0.764,0.15\n2,126,1.35,1.39,0.897,0.28\n")
    drawn: list[Figure] = []
    monkeypatch.setattr(style, "save", lambda fig, path: drawn.append(fig) or path)
    plots.plot_loss_vs_epoch(tmp_path / "epochs.csv", tmp_path / "loss.png",
                             title="bounded-loss: mlp over bounded-loss")
    try:
        assert drawn[0].get_suptitle() == "bounded-loss: mlp over bounded-loss"
        under = drawn[0].axes[0].get_title().replace("\n", " ")
        assert under == condition.describe(load.load_file(EXAMPLES / "bounded-loss.yaml"))
    finally:
        plt.close(drawn[0])
