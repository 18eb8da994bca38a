"""What can be checked of a figure without looking at it: one function, used for every
figure tailcut draws (tests/reports/test_figures.py, tests/reproduce/test_figures.py)."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.text import Text
from matplotlib.transforms import Bbox

UNIT = re.compile(r"\(.+\)|\[.+\]")


def check_figure(fig: Figure, unitless: Collection[str] = (),
                 floors: Mapping[str, float] | None = None) -> None:
    """Assert that `fig`, drawn, is one a paper can take:

    - it has a title, and every text of it (titles, axis and tick labels, legends)
      lies inside the canvas: nothing cut off;
    - every axis shown has a label, with a unit in parentheses or brackets unless
      the label is one of `unitless` (a count: "epoch", "iteration");
    - no legend covers a line or a bar: a legend inside an axes keeps off the data of
      that axes and of any axes drawn on top of it (a twinx);
    - the tick labels along an axis do not run into each other;
    - an axis named in `floors` (by its label) neither shows a tick label below its
      floor nor reaches further below it than a tenth of its span (half a bar, say).
    """
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()   # type: ignore[attr-defined]
    canvas = fig.bbox
    axes = [ax for ax in fig.axes if ax.get_visible()]
    titles = [t for t in [fig._suptitle, *(ax.title for ax in axes)]
              if t is not None and t.get_text().strip()]
    assert titles, "the figure has no title"
    texts: list[Text] = list(titles)
    for ax in axes:
        for axis, name in ((ax.xaxis, "x"), (ax.yaxis, "y")):
            if not axis.get_visible():
                continue
            label = axis.label.get_text()
            assert label.strip(), f"{name} axis of {_name(ax)} has no label"
            assert label in unitless or UNIT.search(label), \
                f"{name} axis label {label!r} gives no unit"
            texts.append(axis.label)
            shown = _tick_labels(ax, name)
            texts += shown
            _assert_apart(shown, name)
            floor = (floors or {}).get(label)
            if floor is not None:
                _assert_floor(ax, name, shown, floor)
    legends = [leg for leg in [*(ax.get_legend() for ax in axes), *fig.legends]
               if leg is not None]
    for leg in legends:
        texts += leg.get_texts()
        _assert_covers_no_data(leg, axes, renderer)
    for text in texts:
        box = text.get_window_extent(renderer)
        assert _inside(box, canvas), f"{text.get_text()!r} is cut off: {box} not in {canvas}"


def _name(ax: Axes) -> str:
    return repr(ax.get_title() or ax.get_ylabel() or "an axes")


def _tick_labels(ax: Axes, name: str) -> list[Text]:
    """The tick labels drawn on `ax`'s `name` axis: non-empty, within its limits."""
    axis = getattr(ax, f"{name}axis")
    low, high = sorted(axis.get_view_interval())
    shown = []
    for tick in axis.get_major_ticks() + axis.get_minor_ticks():
        for label in (tick.label1, tick.label2):
            if (label.get_visible() and label.get_text().strip()
                    and low - 1e-12 * abs(high - low) <= tick.get_loc() <= high
                    + 1e-12 * abs(high - low)):
                shown.append(label)
    return shown


def _assert_apart(labels: list[Text], name: str) -> None:
    boxes = sorted((t.get_window_extent() for t in labels),
                   key=lambda b: b.x0 if name == "x" else b.y0)
    for a, b in zip(boxes, boxes[1:]):
        assert not a.overlaps(b), f"{name} tick labels run together: {a} and {b}"


def _assert_floor(ax: Axes, name: str, labels: list[Text], floor: float) -> None:
    for label in labels:
        value = float(label.get_text().replace("\N{MINUS SIGN}", "-"))
        assert value >= floor, f"{name} axis shows {value}, below {floor}"
    low, high = sorted(getattr(ax, f"get_{name}lim")())
    assert low >= floor - 0.1 * (high - low), f"{name} axis starts at {low}, below {floor}"


def _assert_covers_no_data(leg: Legend, axes: list[Axes], renderer: object) -> None:
    box = leg.get_window_extent(renderer)
    host = leg.axes if leg.axes in axes else None
    if host is None:   # a figure's legend: it must keep off every axes
        for ax in axes:
            assert not box.overlaps(ax.bbox), f"figure legend lies on {_name(ax)}"
        return
    where = host.get_position().bounds
    for ax in (a for a in axes if a.get_position().bounds == where):
        for line in ax.get_lines():
            points = _along(line.get_transform().transform(line.get_xydata()),
                            joined=line.get_linestyle() not in ("None", "", " "))
            assert not box.count_contains(points), \
                f"legend covers the line {line.get_label()!r} of {_name(ax)}"
        for patch in ax.patches:
            assert not box.overlaps(patch.get_window_extent(renderer)), \
                f"legend covers a bar of {_name(ax)}"


def _along(points: np.ndarray, joined: bool) -> np.ndarray:
    """`points` (display coordinates) and, if they are joined by a line, points every
    pixel or so along each segment between them."""
    points = points[np.isfinite(points).all(axis=1)]
    if not joined or len(points) < 2:
        return points
    out = [points]
    for a, b in zip(points[:-1], points[1:]):
        steps = int(np.hypot(*(b - a))) + 1
        out.append(a + np.linspace(0, 1, steps)[:, None] * (b - a))
    return np.concatenate(out)


def _inside(box: Bbox, canvas: Bbox) -> bool:
    return (box.x0 >= canvas.x0 - 0.5 and box.y0 >= canvas.y0 - 0.5
            and box.x1 <= canvas.x1 + 0.5 and box.y1 <= canvas.y1 + 0.5)
