"""Tests of the parameter server's averaging and epoch arithmetic."""

import numpy as np
import pytest

from tailcut import errors
from tailcut.training import ps
from tailcut.transports.base import Kind, Message


def _push(sender: int, values: list[float], mask: list[bool] | None = None) -> Message:
    return Message(
        Kind.PUSH,
        0,
        sender,
        np.array(values, dtype=np.float32),
        None if mask is None else np.array(mask),
    )


def test_ps_averages_each_coordinate_over_workers_that_sent_it() -> None:
    pushes = [
        _push(0, [1.0, 2.0, 3.0], [True, True, False]),
        _push(1, [3.0, 99.0, 5.0], [True, False, True]),
        _push(2, [5.0, 4.0, 7.0]),  # no mask: everything arrived
    ]
    mean, delivered = ps.average(pushes, 3)
    np.testing.assert_allclose(mean, [3.0, 3.0, 6.0])
    assert delivered.all()


def test_a_coordinate_no_worker_delivered_gets_a_zero_step_and_is_flagged() -> None:
    pushes = [_push(0, [1.0, 8.0], [True, False]), _push(1, [3.0, 9.0], [True, False])]
    mean, delivered = ps.average(pushes, 2)
    np.testing.assert_array_equal(mean, [2.0, 0.0])
    np.testing.assert_array_equal(delivered, [True, False])


def test_the_unbiased_rule_divides_each_sum_by_the_workers_times_the_share_delivered() -> None:
    pushes = [
        _push(0, [1.0, 2.0, 3.0], [True, True, False]),
        _push(1, [3.0, 99.0, 5.0], [True, False, True]),
        _push(2, [5.0, 4.0, 7.0]),
    ]
    step, delivered = ps.average(pushes, 3, "unbiased")
    # 7 of the 9 values arrived: sums 9, 6, 12 over 3 workers x 7/9
    np.testing.assert_allclose(step, [9 * 3 / 7, 6 * 3 / 7, 12 * 3 / 7], rtol=1e-6)
    assert delivered.all()


def test_garbage_in_missing_coordinates_never_reaches_the_average() -> None:
    pushes = [_push(0, [np.nan, 1.0], [False, True]), _push(1, [2.0, np.inf], [True, False])]
    mean, _ = ps.average(pushes, 2)
    np.testing.assert_array_equal(mean, [2.0, 1.0])


def test_without_masks_the_average_is_the_plain_mean() -> None:
    rng = np.random.default_rng(0)
    grads = rng.normal(size=(4, 50)).astype(np.float32)
    mean, _ = ps.average([Message(Kind.PUSH, 0, i, g) for i, g in enumerate(grads)], 50)
    np.testing.assert_allclose(mean, grads.mean(axis=0), rtol=1e-5, atol=1e-6)


def test_a_push_of_the_wrong_length_is_a_run_error_naming_the_worker() -> None:
    with pytest.raises(errors.RunError, match="worker 1 pushed 2 values; the model has 3"):
        ps.average([_push(0, [1.0, 2.0, 3.0]), _push(1, [1.0, 2.0])], 3)


@pytest.mark.parametrize(
    ("num_train", "batch_size", "num_workers", "expected"),
    [(8000, 32, 4, 63), (8000, 32, 2, 125), (128, 32, 4, 1), (10, 32, 4, 1)],
)
def test_an_epoch_is_enough_iterations_to_see_every_training_example_once(
    num_train: int, batch_size: int, num_workers: int, expected: int
) -> None:
    assert ps.iterations_per_epoch(num_train, batch_size, num_workers) == expected


def test_shard_0_keeps_a_later_shards_epoch_range_that_comes_before_its_own_barrier(tmp_path):
    # A layer-wise worker pushes the last layers (held by shard 1) first, so shard 1's
    # barrier, and its range for the epoch end, can reach shard 0 before shard 0's
    # own last push: many epoch ends (2 iterations each) make that race likely.
    from tailcut.ml import models
    from tests.training import loopback

    names = [layer.name for layer in models.create(
        "deep-mlp", models.dataset("deep-mlp", 0)).layers]
    levels = {name: min(3, k // 2) for k, name in enumerate(names)}
    job = loopback.Job(tmp_path, num_workers=2, shards=2, options={
        "model": "deep-mlp", "batch_size": 2000, "max_iterations": 16,
        "target_accuracy": None, "max_epochs": 1000,
        "flows": {"policy": "cadentflow", "pull": levels, "push": levels}})
    events = job.run()
    done = events["ps-0"][-1]
    assert done["iterations"] == 16 and done["epochs"] == 8
