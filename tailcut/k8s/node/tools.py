"""The Kubernetes binaries scripts/k8s-tools.sh builds with Go, built when first asked.

    path = tools.binary("kubelet")   # ~/.cache/tailcut/k8s-tools/bin/kubelet

`tailcut run` needs none of them, so `scripts/setup.sh` (the quickstart's set-up) does
not build them: `tailcut cluster up`, the control plane of the k8s tests and helm build
them here the first time one is missing (about 10 minutes on a fresh machine, nothing
once cached). `scripts/setup.sh --cluster` or `--tests` builds them up front.
"""

import os
import subprocess
from pathlib import Path
from typing import Callable

from tailcut.errors import TailcutError

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "k8s-tools.sh"
BUILD_TIMEOUT_S = 3600.0
# What the script builds: the k8s tests' API server and helm, and a cluster node's daemons.
ALL = ["kube-apiserver", "helm", "kubelet", "kube-controller-manager", "kube-scheduler",
       "kube-proxy", "coredns"]
Progress = Callable[[str], None]


class ToolsError(TailcutError):
    """A Kubernetes binary is missing and could not be built; the message says why."""


def tools_dir() -> Path:
    """Where scripts/k8s-tools.sh caches its binaries ($TAILCUT_TOOLS, or ~/.cache/tailcut)."""
    base = os.environ.get("TAILCUT_TOOLS") or str(Path.home() / ".cache" / "tailcut")
    return Path(base) / "k8s-tools" / "bin"


def missing(names: list[str]) -> list[str]:
    return [name for name in names if not (tools_dir() / name).exists()]


def ensure(names: list[str], progress: Progress = print) -> None:
    """Build the binaries `names` (and the rest of the script's set) if any is missing."""
    absent = missing(names)
    if not absent:
        return
    if not SCRIPT.exists():
        raise ToolsError(f"{', '.join(absent)} missing from {tools_dir()}: build them with "
                         "scripts/k8s-tools.sh from a tailcut checkout")
    progress(f"{', '.join(absent)} not built yet: building the Kubernetes binaries with "
             f"{SCRIPT.name} into {tools_dir()} (about 10 min on a fresh machine, once)")
    try:
        # Its stderr (what it builds, Go's errors) goes to the user as it comes.
        out = subprocess.run([str(SCRIPT)], stdout=subprocess.DEVNULL, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        raise ToolsError(f"{SCRIPT} did not finish in {BUILD_TIMEOUT_S:.0f} s") from err
    still = missing(names)
    if out.returncode != 0 or still:
        raise ToolsError(f"{SCRIPT} exited {out.returncode} and {', '.join(still) or 'nothing'} "
                         "is missing; its messages above say why (Go and the module proxy "
                         "are needed)")


def binary(name: str, progress: Progress = print) -> Path:
    """The path of Kubernetes binary `name`, built first if missing."""
    ensure([name], progress)
    return tools_dir() / name
