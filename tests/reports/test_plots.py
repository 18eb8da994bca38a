"""Tests of the loss-vs-epoch plot."""

from pathlib import Path

import matplotlib.image
import pytest

from tailcut.reports import plots

EPOCHS = """epoch,iteration,train_loss,test_loss,test_accuracy,elapsed_s
1,63,2.05,2.06,0.764,0.15
2,126,1.35,1.39,0.897,0.28
3,189,0.71,0.75,0.928,0.41
"""


def test_loss_vs_epoch_writes_a_png_with_drawn_content(tmp_path: Path) -> None:
    (tmp_path / "epochs.csv").write_text(EPOCHS)
    out = plots.plot_loss_vs_epoch(tmp_path / "epochs.csv", tmp_path / "plots" / "loss.png")
    assert out == tmp_path / "plots" / "loss.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = matplotlib.image.imread(out)
    assert pixels.shape[:2] == (450, 700)
    # Not a blank canvas: lines in at least three colours were drawn.
    colours = {tuple(p) for p in pixels[::5, ::5, :3].reshape(-1, 3).round(1).tolist()}
    assert len(colours) > 3


def test_an_epochs_file_without_rows_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "epochs.csv").write_text(EPOCHS.splitlines()[0] + "\n")
    with pytest.raises(ValueError, match="has no epochs to plot"):
        plots.plot_loss_vs_epoch(tmp_path / "epochs.csv", tmp_path / "loss.png")


def test_log_axes_are_labelled_with_plain_numbers_not_mathtext():
    """Mathtext labels ($10^{2}$) cost the report ~0.3 s of CPU to parse."""
    import matplotlib.pyplot as plt
    from tailcut.reports import style
    fig, ax = plt.subplots()
    ax.plot([1.5, 80], [0, 1])
    style.log_scale(ax, "x")
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels(minor=False)
              + ax.get_xticklabels(minor=True) if t.get_text()]
    plt.close(fig)
    assert "10" in labels and "2" in labels and "50" in labels
    assert not any("$" in label for label in labels)
