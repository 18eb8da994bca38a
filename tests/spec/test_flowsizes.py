"""Flow-size CDFs: published points, their means, sampling and capping."""

import random

import pytest

from tailcut.spec import flowsizes


def test_the_published_cdfs_rise_from_0_to_1_over_growing_sizes():
    for points in flowsizes.CDFS.values():
        sizes, probs = zip(*points)
        assert probs[0] == 0 and probs[-1] == 1
        assert list(sizes) == sorted(sizes) and list(probs) == sorted(probs)


def test_web_search_flows_average_1_7_mb_and_data_mining_12_7_mb():
    assert flowsizes.mean_bytes(flowsizes.CDFS["web-search"]) == pytest.approx(1_711_250)
    assert flowsizes.mean_bytes(flowsizes.CDFS["data-mining"]) == pytest.approx(12_658_198.6)


def test_drawn_sizes_average_the_cdf_mean_and_stay_in_its_range():
    rng = random.Random(7)
    points = flowsizes.CDFS["web-search"]
    sizes = [flowsizes.sample(points, rng) for _ in range(100_000)]
    assert sum(sizes) / len(sizes) == pytest.approx(flowsizes.mean_bytes(points), rel=0.03)
    assert 1 <= min(sizes) and max(sizes) <= 30_000_000
    assert sum(s <= 10_000 for s in sizes) / len(sizes) == pytest.approx(0.15, abs=0.01)


def test_a_cap_moves_larger_flows_to_the_cap():
    capped = flowsizes.truncated(flowsizes.CDFS["data-mining"], 10_000_000)
    assert capped[-1] == (10_000_000, 1.0)
    rng = random.Random(1)
    sizes = [flowsizes.sample(capped, rng) for _ in range(50_000)]
    assert max(sizes) == 10_000_000
    assert sum(sizes) / len(sizes) == pytest.approx(flowsizes.mean_bytes(capped), rel=0.05)
