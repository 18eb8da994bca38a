"""How every tailcut figure is laid out, so that a paper can take it as it is.

One place for the habits each plot shares: a figure whose layout keeps every label on
the canvas (matplotlib's constrained layout), a title wrapped to the figure's width
instead of cut off, a legend where it covers no data (measured, not guessed), and
tick labels thinned until they no longer run into each other.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import matplotlib

matplotlib.use("Agg")  # headless: pods and CI have no display

import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.font_manager import FontProperties  # noqa: E402
from matplotlib.legend import Legend  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

SIZE = (7.0, 4.5)   # inches: a one-column figure at 100 dpi is 700 x 450 pixels
DPI = 100
# A character of DejaVu Sans is at most ~0.62 of its font size wide (digits and most
# lower-case letters ~0.55-0.6): what a title or a tick label is measured by before
# anything is drawn.
CHAR_EM = 0.62
SUBTITLE_POINTS = 9
# Inside the axes, in this order; a legend that fits in none of them goes outside.
Inside = Literal["upper right", "upper left", "lower right", "lower left", "center right",
                 "center left", "upper center", "lower center"]
INSIDE = get_args(Inside)


def figure(nrows: int = 1, ncols: int = 1, size: tuple[float, float] = SIZE,
           **kwargs: Any) -> tuple[Figure, Any]:
    """A new figure and its axes (plt.subplots) with constrained layout: titles, axis
    labels, tick labels and a legend outside the axes are all kept on the canvas."""
    return plt.subplots(nrows, ncols, figsize=size, dpi=DPI, layout="constrained", **kwargs)


def title(target: Axes | Figure, text: str, fontsize: float | None = None,
          subtitle: str = "") -> Text:
    """Set `text` as a figure's title (its suptitle, over the whole width) or an axes'
    (a panel's, over its own), wrapped onto as many lines as that width needs: a
    title longer than its figure was cut off. A figure's `subtitle` (the run's
    condition, say) goes in smaller type above its first axes: give one only to a
    figure of one axes (and its twins)."""
    if isinstance(target, Figure):
        size = fontsize or _points(matplotlib.rcParams["figure.titlesize"])
        if subtitle:
            title(target.axes[0], subtitle, fontsize=SUBTITLE_POINTS)
        return target.suptitle(_wrap(text, target.get_figwidth(), size), fontsize=size)
    size = fontsize or _points(matplotlib.rcParams["axes.titlesize"])
    # the axes' width and some of its tick labels': the layout moves it a little yet
    width_in = _figure_of(target).get_figwidth() * min(1.0, target.get_position().width + 0.1)
    return target.set_title(_wrap(text, width_in, size), fontsize=size)


def titled(run: str, what: str) -> str:
    """A figure's title: what it shows, after the run's own title if it has one."""
    return f"{run}: {what}" if run else what


def _wrap(text: str, width_in: float, size: float) -> str:
    """`text` in lines of at most what `width_in` inches hold at `size` points."""
    chars = max(20, int(width_in * 72 / (CHAR_EM * size)))
    return "\n".join(textwrap.wrap(text, chars)) or text


def _points(size: Any) -> float:
    """A font size in points ("large" and the like resolved)."""
    return float(FontProperties(size=size).get_size_in_points())


def _figure_of(ax: Axes) -> Figure:
    fig = ax.get_figure()
    assert isinstance(fig, Figure)
    return fig


def legend(ax: Axes, handles: Sequence[Any] | None = None,
           labels: Sequence[str] | None = None, fontsize: float = 8) -> Legend:
    """A legend of `ax` placed inside it where it covers no data, or else below the
    axes, across the figure (one axes a figure: a second would share that place).
    Data are every line, bar and text of `ax` and of any axes drawn on top of it (a
    twinx), measured where they are drawn: call this after the data and the axis
    limits are set. matplotlib's own loc="best" looks at `ax` alone and settles for
    the least covered place."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    assert labels is not None
    fig = _figure_of(ax)
    renderer = fig.canvas.get_renderer()   # type: ignore[attr-defined]
    shapes = _data_boxes(ax, renderer)
    box = ax.legend(handles, labels, fontsize=fontsize)
    for loc in INSIDE:
        box.set_loc(loc)
        # The layout may yet shrink the axes a little: keep a margin around the legend.
        extent = box.get_window_extent(renderer).padded(6)
        if not any(covers(extent, shape) for shape in shapes):
            return box
    box.remove()
    return figure_legend(fig, handles, labels, fontsize)


def figure_legend(fig: Figure, handles: Sequence[Any], labels: Sequence[str],
                  fontsize: float = 8) -> Legend:
    """A legend for the whole figure, below its axes, in as many columns as its
    widest entry fits across the figure."""
    entry_in = (max(len(label) for label in labels) * CHAR_EM + 4) * fontsize / 72
    ncols = max(1, min(len(labels), int(fig.get_figwidth() // entry_in)))
    return fig.legend(handles, labels, fontsize=fontsize, loc="outside lower center",
                      ncols=ncols)


def _twins(ax: Axes) -> list[Axes]:
    """`ax` and every axes of its figure drawn at the same place (twinx, twiny)."""
    fig = _figure_of(ax)
    where = ax.get_position().bounds
    return [a for a in fig.axes if a is ax or a.get_position().bounds == where]


def _data_boxes(ax: Axes, renderer: Any) -> list[Any]:
    """What a legend in `ax` must not cover, in display coordinates: the path of
    every line (its points alone, for a line drawn as markers), every bar and patch,
    every text and annotation."""
    shapes: list[Any] = []
    for a in _twins(ax):
        a.get_xlim(), a.get_ylim()   # autoscale now: the transforms below use the limits
        for line in a.get_lines():
            if not line.get_visible() or np.size(line.get_xydata()) == 0:
                continue
            path = line.get_transform().transform_path(line.get_path())
            shapes.append(path if line.get_linestyle() not in ("None", "", " ")
                          else path.vertices)
        shapes += [p.get_window_extent(renderer) for p in a.patches if p.get_visible()]
        shapes += [t.get_window_extent(renderer) for t in a.texts if t.get_visible()]
    return shapes


def covers(box: Bbox, shape: Any) -> bool:
    """Whether `box` (display coordinates) covers any of `shape`: a Bbox, a Path (a
    line through its vertices) or an array of points."""
    if isinstance(shape, Bbox):
        return bool(box.overlaps(shape))
    if hasattr(shape, "intersects_bbox"):
        return bool(shape.intersects_bbox(box, filled=False))
    return bool(box.count_contains(shape) > 0)


def ticks(ax: Axes, which: str, values: Sequence[float], labels: Sequence[str],
          fontsize: float = 10) -> None:
    """Ticks at `values` labelled `labels` on `ax`'s `which` axis ("x" or "y"), thinned
    to every n-th one when their labels, side by side, would run into each other."""
    fig = _figure_of(ax)
    pos = ax.get_position()
    length_in = (pos.width * fig.get_figwidth() if which == "x"
                 else pos.height * fig.get_figheight())
    widest = max((len(label) for label in labels), default=1) if which == "x" else 1
    per_label_in = (widest * CHAR_EM + 1.5) * fontsize / 72   # the label and a gap
    step = max(1, math.ceil(len(values) * per_label_in / max(length_in, 0.1)))
    keep = list(range(0, len(values), step))
    getattr(ax, f"set_{which}ticks")([values[i] for i in keep], [labels[i] for i in keep],
                                     fontsize=fontsize)


def log_scale(ax: Axes, which: str) -> None:
    """A log scale on axes ``ax``'s ``which`` axis ("x" or "y"), labelled with plain
    numbers ("0.1", "10", "1000"): matplotlib's default labels are mathtext ($10^{2}$),
    whose parser cost about 0.3 s of the report's CPU the first time it ran. The minor
    ticks at the 2s and 5s of each decade are labelled too when the axis spans fewer
    than three decades; over more, their labels ran into the decades' own."""
    from matplotlib.ticker import FuncFormatter
    getattr(ax, f"set_{which}scale")("log")
    axis = getattr(ax, f"{which}axis")
    axis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))

    def two_and_five(value: float, _pos: int) -> str:
        low, high = sorted(axis.get_view_interval())
        if value <= 0 or low <= 0 or math.log10(high / low) >= 3:
            return ""
        leading = value / 10 ** math.floor(math.log10(value))
        return f"{value:g}" if round(leading) in (2, 5) else ""

    axis.set_minor_formatter(FuncFormatter(two_and_five))


def save(fig: Figure, path: Path) -> Path:
    """Write `fig` to `path` and free it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # zlib level 1: ~9 ms a figure to encode instead of ~14 (level 6), files ~1.15x larger
        fig.savefig(path, pil_kwargs={"compress_level": 1})
    finally:
        plt.close(fig)
    return path
