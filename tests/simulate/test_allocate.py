"""Rate allocation of the three policies on small, hand-checkable cases."""

import numpy as np
import pytest

from tailcut.simulate import allocate

INF = np.inf


def test_max_min_gives_the_unconstrained_flow_what_the_bottlenecked_one_leaves():
    # Links 0 (cap 10) and 1 (cap 4); flow A uses 0, flow B uses 0 and 1; 2 = dummy.
    paths = np.array([[0, 2], [0, 1]])
    rates = allocate.max_min(paths, np.array([10.0, 4.0, INF]))
    assert rates == pytest.approx([6.0, 4.0])


def test_madd_makes_every_flow_of_a_coflow_finish_together():
    paths = np.array([[0, 2], [0, 2]])
    remaining = np.array([1.0, 3.0])
    rates = allocate.madd(paths, remaining, np.array([7, 7]), np.array([4.0, 4.0, INF]))
    assert remaining / rates == pytest.approx([1.0, 1.0])


def test_madd_serves_the_coflow_with_the_smaller_bottleneck_first():
    paths = np.array([[0, 2], [0, 2]])
    rates = allocate.madd(paths, np.array([8.0, 2.0]), np.array([1, 2]),
                          np.array([4.0, 4.0, INF]))
    assert rates == pytest.approx([0.0, 4.0])


def test_strict_priority_starves_the_lower_level_on_a_shared_link():
    paths = np.array([[0, 2], [0, 2], [1, 2]])
    rates = allocate.strict(paths, np.array([1.0, 0.0, 1.0]), np.array([5.0, 5.0, INF]))
    assert rates == pytest.approx([0.0, 5.0, 5.0])
