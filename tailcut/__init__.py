"""tailcut: a testbed for ML-aware network transport.

The public API is small on purpose: load a TrainingJob, run it, catch tailcut's
errors. Everything else is reached through its module (tailcut.net.build, ...).
numpy is not imported here: role processes must limit its threads before it loads.
"""

from tailcut.errors import KernelFeatureMissing, RunError, SpecError, TailcutError
from tailcut.spec import TrainingJob, load_file

__version__ = "0.1.0"

__all__ = ["KernelFeatureMissing", "RunError", "SpecError", "TailcutError", "TrainingJob",
           "__version__", "load_file"]
