"""Which parameters the ToR holds: the measured top k (the sparse model's dense head
and most frequent ids first), the same in every role; a given list as is."""

import numpy as np
import pytest

from tailcut.ml import models
from tailcut.training import hotchoice


@pytest.fixture(scope="module")
def sparse():
    dataset = models.dataset("sparse", 0)
    return models.create("sparse", dataset), dataset


def test_the_top_k_are_the_most_updated_and_every_role_picks_the_same(sparse):
    model, dataset = sparse
    chosen = hotchoice.select({"top_k": 3000}, model, dataset, 32, 0)
    again = hotchoice.select({"top_k": 3000, "indices": None}, model, dataset, 32, 0)
    assert np.array_equal(chosen, again) and len(chosen) == 3000
    assert np.all(np.diff(chosen) > 0)
    counts = hotchoice.update_frequency(model, dataset, 32, 0)
    rest = np.setdiff1d(np.arange(model.num_params), chosen)
    assert counts[chosen].min() >= counts[rest].max()
    head = np.arange(90000, model.num_params)            # fc1/fc2: in every update
    assert np.isin(head, chosen).all()
    # Zipf ids: a small hot set takes most of the updates
    assert counts[chosen].sum() / counts.sum() > 0.6


def test_a_list_is_taken_sorted_and_checked_against_the_model(sparse):
    model, dataset = sparse
    assert list(hotchoice.select({"indices": [9, 3, 5]}, model, dataset, 32, 0)) == [3, 5, 9]
    with pytest.raises(ValueError, match="past the model's 92113"):
        hotchoice.select({"indices": [92113]}, model, dataset, 32, 0)
