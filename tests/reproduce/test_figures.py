"""The figures of `tailcut reproduce`'s reports, drawn from small synthetic inputs, pass
the same checks as a run's (tests/reports/figure_checks.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.figure import Figure

from tailcut.reproduce import figures
from tests.reports.figure_checks import check_figure

RNG = np.random.default_rng(3)


def _ratios() -> Figure:
    labels = [f"imc20.fig{i}.rpc_latency_p99_of_push" for i in range(12)]
    values = [0.5, 0.9, 1.1, 1.3, 3.0, 0.0, 1.0, 0.7, 12.0, 0.2, 1.0, 0.95]
    return figures.draw_ratios(labels, values,
                               "IMC'20: each of our numbers over the paper's, quickstart "
                               "at 200 Mbit/s, background 0.5 on rack-1's uplink")


def _cdf() -> Figure:
    return figures.draw_cdf(
        {"tcp (500 pushes)": list(RNG.lognormal(-6, 1, 500)),
         "bounded-loss (500 pushes)": list(RNG.lognormal(-6.5, 0.5, 500)),
         "nothing to plot": []},
        "Gradient push completion, quickstart MLP, 1% loss on every link",
        "push completion time (s)")


def _bars(groups: int) -> Callable[[], Figure]:
    names = [f"{m} {w}W" for m in ("mlp", "lenet", "resnet18", "vgg16") for w in (4, 8)]
    return lambda: figures.draw_grouped_bars(
        names[:groups],
        {p: list(RNG.uniform(0.5, 1.2, groups)) for p in ("tcp", "cadentflow", "pfabric")},
        "Training (Fig. 3): iteration time / ordered TCP (10 Gbit/s, K80 compute)",
        "iteration time / TCP (ratio)", reference=1.0)


FIGURES: dict[str, Callable[[], Figure]] = {
    "ours_vs_paper.png": _ratios,
    "push_completion_cdf.png": _cdf,
    "fig3-ratios.png, 3 models": _bars(3),
    "fig3-ratios.png, 8 models": _bars(8),
}


@pytest.mark.parametrize("name", FIGURES)
def test_every_reproduce_figure_has_units_a_whole_title_and_a_legend_off_its_data(
        name: str) -> None:
    fig = FIGURES[name]()
    try:
        check_figure(fig, unitless={"number compared", "model"})
    finally:
        plt.close(fig)


def test_the_writers_still_write_their_pngs(tmp_path: Path) -> None:
    written = [
        figures.ratios(["a", "b"], [0.9, 2.0], tmp_path / "r.png", "ours over the paper's"),
        figures.cdf({"tcp": [0.1, 0.2, 0.4]}, tmp_path / "c.png", "a CDF", "time (s)"),
        figures.grouped_bars(["mlp"], {"tcp": [1.0]}, tmp_path / "b.png", "bars",
                             "JCT / TCP (ratio)", reference=1.0),
    ]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plt.get_fignums() == []   # every figure freed
