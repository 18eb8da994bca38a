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

# The links of the runs that compare transports: the rate at which a 2-core host ran
# the quickstart's tcp and bounded-loss pairs network-bound in every condition
# (bench/bl_conditions.py; docs/fidelity.md), so that the comparison is of the
# transports on the network and not of their CPU cost. At 1 Gbit/s the host bound or
# nearly bound bounded loss's runs, and the congested and incast ones of tcp too.
# (The torch jobs of the Gloo section were not calibrated: their verdicts say.)
COMPARISON_BANDWIDTH = "200Mbit"


def two_racks(name: str, *, model: str = "mlp", workers: int = 4,
              transport: Optional[Raw] = None, loss: Optional[float] = None,
              target_accuracy: Optional[float] = 0.93, epochs: int = 30,
              learning_rate: float = 0.1, batch_size: int = 32,
              buffer_bytes: Optional[int] = None, bandwidth: str = "1Gbit") -> Raw:
    """The quickstart's shape: 1 PS and the workers in two racks, links of `bandwidth`
    (the quickstart's 1 Gbit/s by default); the first half of the workers share rack-0
    with the PS (as examples/quickstart.yaml). ``buffer_bytes``: every switch port's
    buffer, on the access links and the uplinks."""
    half = (workers + 1) // 2
    placement = {"ps-0": "rack-0"}
    placement.update({f"worker-{i}": "rack-0" if i < half else "rack-1"
                      for i in range(workers)})
    access: Raw = {"bandwidth": bandwidth}
    uplink: Raw = {"bandwidth": bandwidth}
    if loss is not None:
        access["loss"] = loss
    if buffer_bytes is not None:
        access["bufferBytes"] = uplink["bufferBytes"] = buffer_bytes
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
                        "uplink": uplink},
            "transport": transport or {"type": "tcp"},
        },
    }


def one_rack(name: str, **kwargs: Any) -> Raw:
    """two_racks' job with the PS and every worker in one rack (examples/incast.yaml):
    the workers' pushes meet at the PS's port."""
    raw = two_racks(name, **kwargs)
    raw["spec"]["network"]["racks"] = [{"name": "rack-0"}]
    raw["spec"]["network"]["placement"] = {
        pod: "rack-0" for pod in raw["spec"]["network"]["placement"]}
    return raw


def with_background(raw: Raw, load_factor: float, warmup_s: float = 3.0) -> Raw:
    """The same job under other applications' flows, as examples/quickstart-background.yaml:
    web-search sizes from a server in rack-1 into the PS's pod, at ``load_factor`` of
    rack-1's uplink, the path the gradients of rack-1's workers take."""
    out = copy.deepcopy(raw)
    out["spec"]["backgroundLoad"] = {
        "senders": ["rack-1"], "receivers": ["ps-0"],
        "target": {"link": "uplink/rack-1", "loadFactor": load_factor},
        "flowSizes": {"distribution": "web-search"}, "shape": {"type": "constant"},
        "warmupS": warmup_s}
    return out


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
