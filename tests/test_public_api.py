"""The names `import tailcut` promises, and what it must not drag in."""

import subprocess
import sys

import tailcut


def test_the_public_api_is_exactly_what_is_promised():
    assert sorted(tailcut.__all__) == ["KernelFeatureMissing", "RunError", "SpecError",
                                       "TailcutError", "TrainingJob", "__version__",
                                       "load_file"]
    for name in tailcut.__all__:
        assert hasattr(tailcut, name)


def test_importing_tailcut_does_not_import_numpy():
    # A role sets numpy's thread count before numpy loads; the package must not beat it.
    code = "import sys, tailcut; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr
