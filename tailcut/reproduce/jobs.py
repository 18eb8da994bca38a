"""The TrainingJobs a reproduction runs, written as YAML into their step's directory.

They are built here rather than copied from examples/ (an installed tailcut has no
examples/), and checked with the spec before any step starts, so a mistake here is a
SpecError at once, not a failed step twenty minutes in."""

from __future__ import annotations

import copy
from typing import Any, Optional

import yaml

from tailcut import spec

Raw = dict[str, Any]


def two_racks(name: str, *, model: str = "mlp", workers: int = 4,
              transport: Optional[Raw] = None, loss: Optional[float] = None,
              target_accuracy: Optional[float] = 0.93, epochs: int = 30,
              learning_rate: float = 0.1, batch_size: int = 32) -> Raw:
    """The quickstart's shape: 1 PS and the workers in two racks, 1 Gbit/s links; the
    first half of the workers share rack-0 with the PS (as examples/quickstart.yaml)."""
    half = (workers + 1) // 2
    placement = {"ps-0": "rack-0"}
    placement.update({f"worker-{i}": "rack-0" if i < half else "rack-1"
                      for i in range(workers)})
    access: Raw = {"bandwidth": "1Gbit"}
    if loss is not None:
        access["loss"] = loss
    training: Raw = {"model": model, "batchSize": batch_size, "learningRate": learning_rate,
                     "epochs": epochs}
    if target_accuracy is not None:
        training["targetAccuracy"] = target_accuracy
    return {
        "apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": {"parameterServers": 1, "workers": workers},
            "training": training,
            "network": {"racks": [{"name": "rack-0"}, {"name": "rack-1"}],
                        "placement": placement, "accessLink": access,
                        "uplink": {"bandwidth": "1Gbit"}},
            "transport": transport or {"type": "tcp"},
        },
    }


def capped(raw: Raw, iterations: int) -> Raw:
    """The same job for a fixed number of iterations and no accuracy target (--quick)."""
    out = copy.deepcopy(raw)
    training = out["spec"]["training"]
    training.pop("targetAccuracy", None)
    training["iterations"] = iterations
    return out


def render(raw: Raw) -> str:
    """The job's YAML, after the spec accepted it."""
    spec.from_dict(copy.deepcopy(raw))
    return yaml.safe_dump(raw, sort_keys=False)
