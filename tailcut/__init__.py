"""tailcut: a testbed for ML-aware network transport.

The public API is small on purpose: load a TrainingJob, run it, catch tailcut's
errors. Everything else is reached through its module (tailcut.net.build, ...).
numpy is not imported here: role processes must limit its threads before it loads.
The spec (pydantic models, a third of a second to import) loads on first use of
TrainingJob or load_file, so a role process, which never needs it, starts faster.
"""

from typing import TYPE_CHECKING, Any

from tailcut.errors import KernelFeatureMissing, RunError, SpecError, TailcutError

if TYPE_CHECKING:
    from tailcut.spec import TrainingJob, load_file

__version__ = "0.1.0"

__all__ = ["KernelFeatureMissing", "RunError", "SpecError", "TailcutError", "TrainingJob",
           "__version__", "load_file"]


def __getattr__(name: str) -> Any:
    if name in ("TrainingJob", "load_file"):
        from tailcut import spec
        return getattr(spec, name)
    raise AttributeError(f"module 'tailcut' has no attribute {name!r}")
