"""Tests of the PS's aggregation rules: what each returns, and their bias measured
over many random drop draws (fixed seeds, stated tolerances)."""

import numpy as np
import pytest

from tailcut.training import aggregation

# One iteration of N workers' gradients over SIZE coordinates, lost at random.
SIZE = 3000
DRAWS = 4000
# The means over DRAWS draws scatter by about 2e-4 around their expectation (standard
# error of the regression slope below); 0.005 is ~25 of those, and far below the
# 0.0625 and 0.25 by which today's rule misses.
TOLERANCE = 0.005


class _Stats:
    """One rule's estimates per coordinate, summed over the draws."""

    def __init__(self) -> None:
        self.sum = np.zeros(SIZE)
        self.squares = np.zeros(SIZE)
        self.given_delivered = np.zeros(SIZE)  # summed only where some value arrived
        self.delivered = np.zeros(SIZE)

    def add(self, step: np.ndarray, delivered: np.ndarray) -> None:
        self.sum += step
        self.squares += step.astype(np.float64) ** 2
        self.given_delivered += np.where(delivered, step, 0.0)
        self.delivered += delivered

    @property
    def mean(self) -> np.ndarray:
        return self.sum / DRAWS

    @property
    def standard_error(self) -> np.ndarray:
        return np.sqrt((self.squares / DRAWS - self.mean ** 2) / DRAWS)


def _draws(num_workers: int, q: float, seed: int) -> tuple[np.ndarray, dict[str, _Stats]]:
    """The all-worker mean and each rule's estimates over DRAWS draws of random loss
    (each value arrives with probability q, independently)."""
    rng = np.random.default_rng(seed)
    # Mean 1: a rule that shrinks the step shows as a slope below 1.
    grads = rng.normal(1.0, 1.0, size=(num_workers, SIZE)).astype(np.float32)
    stats = {rule: _Stats() for rule in aggregation.RULES}
    for _ in range(DRAWS):
        arrived = rng.random((num_workers, SIZE)) < q
        total = np.where(arrived, grads, 0).sum(axis=0)
        counts = arrived.sum(axis=0).astype(np.float32)
        for rule in aggregation.RULES:
            stats[rule].add(*aggregation.combine(total, counts, rule))
    return grads.mean(axis=0, dtype=np.float64), stats


def _slope(estimate: np.ndarray, truth: np.ndarray) -> float:
    """Least-squares slope through 0 of the estimate per coordinate on the truth."""
    return float(estimate @ truth / (truth @ truth))


@pytest.mark.parametrize("num_workers", [4, 2])
def test_unbiased_matches_the_all_worker_mean_and_today_shrinks_by_the_chance_all_lost(
    num_workers: int,
) -> None:
    q = 0.5  # half of every message arrives
    truth, stats = _draws(num_workers, q, seed=7)
    unbiased, mean_rule = stats["unbiased"], stats["mean"]
    assert _slope(unbiased.mean, truth) == pytest.approx(1.0, abs=TOLERANCE)
    # and coordinate by coordinate: within 5 standard errors of the all-worker mean
    z = (unbiased.mean - truth) / unbiased.standard_error
    assert np.abs(z).max() < 5.0
    # Today's rule is biased toward 0 by P(nobody delivered) = (1 - q)^N:
    # 0.0625 with 4 workers, 0.25 with 2.
    shrink = 1 - (1 - q) ** num_workers
    assert _slope(mean_rule.mean, truth) == pytest.approx(shrink, abs=TOLERANCE)
    assert abs(_slope(mean_rule.mean, truth) - 1.0) > 10 * TOLERANCE
    # ... only through the coordinates nobody delivered: given one arrived, it is unbiased.
    given = mean_rule.given_delivered / mean_rule.delivered
    assert _slope(given, truth) == pytest.approx(1.0, abs=TOLERANCE)


def test_the_price_of_unbiased_is_variance_where_workers_agree() -> None:
    num_workers, q = 4, 0.9  # 10% loss
    rng = np.random.default_rng(3)
    g = np.float32(0.5)
    steps = {rule: [] for rule in aggregation.RULES}
    for _ in range(500):
        arrived = rng.random((num_workers, SIZE)) < q
        total = (arrived * g).sum(axis=0, dtype=np.float32)
        counts = arrived.sum(axis=0).astype(np.float32)
        for rule in aggregation.RULES:
            step, delivered = aggregation.combine(total, counts, rule)
            steps[rule].append(step[delivered])
    mean_rule, unbiased = (np.concatenate(steps[r]) for r in aggregation.RULES)
    np.testing.assert_array_equal(mean_rule, g)  # every worker said g: the mean is g
    # inverse-probability weighting scatters by sqrt((1 - q) / (N q)) of g: 17% here
    assert unbiased.std() / g == pytest.approx(np.sqrt((1 - q) / (num_workers * q)), rel=0.05)


def test_without_loss_both_rules_give_the_plain_mean_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    grads = rng.normal(size=(3, 40)).astype(np.float32)
    total = grads.sum(axis=0)
    counts = np.full(40, 3, dtype=np.float32)
    mean, _ = aggregation.combine(total, counts, "mean")
    unbiased, delivered = aggregation.combine(total, counts, "unbiased")
    np.testing.assert_array_equal(mean, unbiased)
    np.testing.assert_allclose(mean, grads.mean(axis=0), rtol=1e-6)
    assert delivered.all()


def test_unbiased_divides_by_the_workers_times_the_share_that_arrived() -> None:
    total = np.array([9.0, 6.0, 12.0, 0.0])
    counts = np.array([3.0, 2.0, 2.0, 0.0])  # 7 of 3 x 4 values arrived: N q_hat = 7/4
    step, delivered = aggregation.combine(total, counts, "unbiased")
    np.testing.assert_allclose(step, [9 * 4 / 7, 6 * 4 / 7, 12 * 4 / 7, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(delivered, [True, True, True, False])
    assert step.dtype == np.float32  # float64 sums (in-network) give a float32 step


def test_nothing_delivered_is_no_step_under_either_rule() -> None:
    for rule in aggregation.RULES:
        step, delivered = aggregation.combine(np.zeros(5), np.zeros(5), rule)
        np.testing.assert_array_equal(step, 0.0)
        assert not delivered.any()


def test_an_unknown_rule_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="aggregation='median': must be one of mean, unbiased"):
        aggregation.combine(np.zeros(2), np.ones(2), "median")
