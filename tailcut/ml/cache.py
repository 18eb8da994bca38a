"""A disk cache of generated datasets, so that a run's roles (and later runs) load the
arrays instead of generating them again.

Every role of a run generates the same data from the same seed (data.py); for the
quickstart's MLP that is a quarter second of CPU per role, five roles on two cores.
A cached dataset is a directory of .npy files under $TAILCUT_CACHE_DIR (default
~/.cache/tailcut/datasets), named by the model, the seed and a digest of every
generator's source (tailcut/ml/*.py) and of numpy's version, so a change to either is
a miss, never a stale hit. It is written to a temporary directory and renamed into
place: readers see a whole dataset or none. It is only a cache: a directory that
cannot be written (a read-only image) means generating every time, not an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from functools import cache
from pathlib import Path

import numpy as np

from tailcut.ml import data

ARRAYS = ("x_train", "y_train", "x_test", "y_test")

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    configured = os.environ.get("TAILCUT_CACHE_DIR")
    if configured:
        return Path(configured)
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(home) / "tailcut" / "datasets"


@cache
def _digest() -> str:
    sources = sorted(Path(__file__).resolve().parent.glob("*.py"))
    h = hashlib.sha256(np.__version__.encode())
    for path in sources:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def path(name: str, seed: int) -> Path:
    return cache_dir() / f"{name}-seed{seed}-{_digest()}"


def load(name: str, seed: int) -> data.Dataset | None:
    """The cached dataset of model `name` and `seed`, or None."""
    where = path(name, seed)
    try:
        meta = json.loads((where / "meta.json").read_text())
        arrays = {a: np.load(where / f"{a}.npy", allow_pickle=False) for a in ARRAYS}
    except (OSError, ValueError):
        return None
    return data.Dataset(**arrays, num_classes=int(meta["num_classes"]),
                        sizes={k: int(v) for k, v in meta["sizes"].items()})


def store(name: str, seed: int, dataset: data.Dataset) -> None:
    """Cache `dataset` as model `name`'s for `seed`; quietly not, if it cannot be written."""
    where = path(name, seed)
    if where.exists():
        return
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{where.name}.", dir=where.parent))
        for a in ARRAYS:
            np.save(tmp / f"{a}.npy", getattr(dataset, a), allow_pickle=False)
        (tmp / "meta.json").write_text(json.dumps(
            {"num_classes": dataset.num_classes, "sizes": dataset.sizes}))
        try:
            os.rename(tmp, where)
        except OSError:   # another role of the run got there first: theirs is the same
            _remove(tmp)
    except OSError as err:
        log.debug("dataset cache %s not written: %s", where, err)


def _remove(tmp: Path) -> None:
    for f in tmp.iterdir():
        f.unlink()
    tmp.rmdir()
