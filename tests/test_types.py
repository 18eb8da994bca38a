"""The package type-checks under `mypy --strict` (configured in pyproject.toml)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_passes_mypy_strict() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
