"""Thinned curves: fewer points, the same picture."""

import numpy as np

from tailcut.reports import thin


def test_a_cdf_of_few_distinct_values_keeps_each_runs_ends_so_its_stairs_are_exact():
    values = np.random.default_rng(1).integers(1, 5, size=9000)
    x, y = thin.cdf(values, max_points=100)
    assert x.size <= 8
    full_x = np.sort(values)
    full_y = np.arange(1, values.size + 1) / values.size
    for v in np.unique(values):   # every step's bottom and top, as with every point
        on = full_x == v
        assert full_y[on].min() in y[x == v] and full_y[on].max() in y[x == v]


def test_a_cdf_of_many_distinct_values_moves_by_at_most_one_step_between_points():
    values = np.random.default_rng(2).lognormal(size=3500)
    x, y = thin.cdf(values, max_points=1000)
    assert 900 <= x.size <= 1002
    assert x[0] == values.min() and x[-1] == values.max() and y[-1] == 1.0
    # one step is at most ceil(3499 / 999) = 4 ranks of the 3500
    assert np.all(np.diff(x) >= 0) and np.diff(y).max() <= 4 / 3500 + 1e-12
    small_x, small_y = thin.cdf([3.0, 1.0, 2.0])
    assert small_x.tolist() == [1.0, 2.0, 3.0] and small_y.tolist() == [1 / 3, 2 / 3, 1.0]


def test_log_spaced_indices_span_the_curve_evenly_on_a_log_axis():
    drawn = thin.log_spaced(64714, max_points=1000)
    assert drawn[0] == 0 and drawn[-1] == 64713 and drawn.size <= 1002
    assert np.all(np.diff(drawn) > 0)
    ratios = (drawn[1:] + 1) / (drawn[:-1] + 1)
    # every k up to ~90, then less than 1% of a decade apart (~1 pixel of 110)
    assert drawn[:80].tolist() == list(range(80))
    assert np.log10(ratios[drawn[:-1] >= 99]).max() < 0.01
    assert thin.log_spaced(5).tolist() == [0, 1, 2, 3, 4]
