"""The package keeps its layers (the import-linter contracts in pyproject.toml: the
package's layers, the planners apart from the appliers, and tailcut.k8s's rooms)."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "3 kept, 0 broken" in done.stdout


# What applies a plan (netlink, the BPF loaders, the transports, the kernel probes):
# the forbidden contract's own list, so that the test and the contract cannot drift.
APPLIERS = tuple(next(c for c in tomllib.loads((ROOT / "pyproject.toml").read_text())
                      ["tool"]["importlinter"]["contracts"]
                      if c["type"] == "forbidden")["forbidden_modules"])


def test_the_operator_loads_planners_only() -> None:
    # Issue 45: the operator plans jobs and never applies them. import-linter cannot see
    # operator/handlers.py (it is outside the package), so import it in a fresh
    # interpreter, as kopf does, and list what that loaded.
    script = ("import sys; sys.path.insert(0, 'operator'); import handlers; "
              "print('\\n'.join(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = done.stdout.split()
    assert "handlers" in loaded and "tailcut.plan" in loaded   # it did import the operator
    within = tuple(a + "." for a in APPLIERS)
    assert [m for m in loaded if m in APPLIERS or m.startswith(within)] == []
