"""Tests of the parameter server's epoch and shard arithmetic."""

import pytest

from tailcut.training import ps


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
