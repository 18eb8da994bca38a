"""The dataset cache: a hit is the same arrays as generating, a miss generates."""

import numpy as np
import pytest

from tailcut.ml import cache, data, models

ARRAYS = ("x_train", "y_train", "x_test", "y_test")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TAILCUT_CACHE_DIR", str(tmp_path / "datasets"))
    return tmp_path / "datasets"


def _same(a, b):
    return (a.num_classes == b.num_classes and a.sizes == b.sizes
            and all(getattr(a, k).dtype == getattr(b, k).dtype
                    and np.array_equal(getattr(a, k), getattr(b, k)) for k in ARRAYS))


def test_a_cached_dataset_is_the_generated_one_and_is_read_back(cache_dir):
    first = models.dataset("mf", 3)      # generated, then stored
    assert [p.name for p in cache_dir.iterdir()] == [cache.path("mf", 3).name]
    assert _same(cache.load("mf", 3), first)
    assert _same(models.dataset("mf", 3), models.info("mf").make_dataset(3))


def test_another_seed_or_changed_generator_source_is_a_miss(cache_dir, monkeypatch):
    models.dataset("mf", 3)
    assert cache.load("mf", 4) is None
    monkeypatch.setattr(cache, "_digest", lambda: "other-source")
    assert cache.load("mf", 3) is None


def test_an_unwritable_cache_directory_only_means_generating(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TAILCUT_CACHE_DIR", str(blocker / "datasets"))
    assert _same(models.dataset("mf", 3), models.info("mf").make_dataset(3))
    assert cache.load("mf", 3) is None


def test_the_text_dataset_comes_back_bit_for_bit(cache_dir):
    models.dataset("mlp", 0)
    assert _same(models.dataset("mlp", 0), data.make_text_dataset(0))
