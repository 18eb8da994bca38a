"""The package type-checks under `mypy --strict` (configured in pyproject.toml).

mypy keeps its incremental cache under ~/.cache/tailcut/mypy (TAILCUT_MYPY_CACHE), as
tailcut keeps its other build products there, so a fresh checkout re-checks only what
differs from the last one checked on this machine: about 1 s of CPU instead of 12.
The cache is only ever a shortcut: mypy re-checks any module whose source hash, or
whose dependencies' interfaces, options or mypy version differ from what the cache
recorded, writes its files atomically, and treats an unreadable one as missing."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cache_dir() -> Path:
    env = os.environ.get("TAILCUT_MYPY_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tailcut" / "mypy"


def test_the_package_passes_mypy_strict() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache_dir())],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
