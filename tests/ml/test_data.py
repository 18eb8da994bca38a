"""Tests of the generated text-like dataset and of sharding."""

import time

import numpy as np
import pytest

from tailcut.ml import data


def test_same_seed_gives_identical_arrays_and_another_seed_does_not() -> None:
    a, b, c = data.make_text_dataset(3), data.make_text_dataset(3), data.make_text_dataset(4)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.x_train, c.x_train)


def test_features_are_unit_length_float32_rows_and_every_class_appears() -> None:
    ds = data.make_text_dataset(0, num_classes=7, vocab_size=300, num_train=700, num_test=200)
    assert ds.x_train.dtype == np.float32 and ds.x_test.dtype == np.float32
    assert ds.x_train.shape == (700, 300) and ds.x_test.shape == (200, 300)
    assert ds.num_features == 300
    np.testing.assert_allclose(np.linalg.norm(ds.x_train, axis=1), 1.0, rtol=1e-5)
    assert (ds.x_train >= 0).all()
    assert set(np.unique(ds.y_train)) == set(range(7))
    # Bag of words: most of the vocabulary is absent from any one document.
    assert np.count_nonzero(ds.x_train) / ds.x_train.size < 0.1


def test_classes_share_vocabulary_so_no_word_alone_names_the_class() -> None:
    ds = data.make_text_dataset(0)
    used = ds.x_train > 0
    classes_per_word = np.array(
        [len(np.unique(ds.y_train[used[:, w]])) for w in range(ds.num_features)]
    )
    # The background vocabulary is shared by every class.
    assert (classes_per_word == ds.num_classes).sum() > 100


def test_generation_of_the_default_dataset_takes_well_under_a_second() -> None:
    data.make_text_dataset(1)  # warm up imports and caches
    start = time.perf_counter()
    data.make_text_dataset(2)
    assert time.perf_counter() - start < 1.0


def test_shards_partition_the_rows_in_order_with_sizes_differing_by_at_most_one() -> None:
    x = np.arange(23, dtype=np.float32).reshape(23, 1)
    y = np.arange(23)
    parts = [data.shard(x, y, i, 4) for i in range(4)]
    sizes = [len(px) for px, _ in parts]
    assert max(sizes) - min(sizes) <= 1
    np.testing.assert_array_equal(np.concatenate([py for _, py in parts]), y)
    for px, py in parts:
        np.testing.assert_array_equal(px[:, 0], py)


@pytest.mark.parametrize(("index", "count"), [(4, 4), (-1, 4), (0, 0)])
def test_shard_rejects_an_index_outside_the_shard_count(index: int, count: int) -> None:
    with pytest.raises(ValueError, match="index"):
        data.shard(np.zeros((8, 1)), np.zeros(8), index, count)
