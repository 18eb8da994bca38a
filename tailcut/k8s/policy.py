"""spec.scheduling on Kubernetes: what the operator refuses before it creates anything,
and the per-tensor tags it hands the PS and worker pods.

- `fair`: nothing to add; pods send whole, untagged messages.
- `cadentflow`: the node agent (tailcut.k8s.agent) puts the HTB priority classes and
  the DSCP classifier on each pod's eth0 (tailcut.scheduling.enforce.apply_to), and
  the pods send each tensor as its own tagged part (tcp, udp, bounded-loss). They read their levels from the
  job's config map, key flows.json: the `flows` section `tailcut run` gives its roles
  (tailcut.scheduling.flowreport.role_flows), e.g.

      {"policy": "cadentflow", "pull": {"fc1.weight": 0, ...}, "push": {...}}

- `coflow`: needs a controller pacing every flow to its MADD rate, which neither the
  agent nor the pods have: refused by `check`, naming spec.scheduling.policy.
"""

import json
from typing import Any

from tailcut.errors import SpecError
from tailcut.scheduling import enforce, flowreport
from tailcut.spec.model import TrainingJob

ENFORCED = ("fair", "cadentflow")   # what the node agent can enforce
FLOWS_KEY = "flows.json"            # config map key; the pods see SPEC_MOUNT/flows.json

_flows_cache: dict[str, dict[str, Any]] = {}


def check(job: TrainingJob) -> None:
    """Refuse a scheduling section the Kubernetes path cannot honour, naming the
    field: what `check_enforceable` refuses, and a hand-written tag for a tensor the
    model lacks (resolving the tags builds the model: the operator's job, not the
    agent's)."""
    check_enforceable(job)
    role_flows(job)


def check_enforceable(job: TrainingJob) -> None:
    """Refuse a policy the node agent does not enforce, and cadentflow with what
    cannot tag its flows (enforce.check_runnable: app-drop, aggregators, a PS
    replica)."""
    policy = job.spec.scheduling.policy
    if policy not in ENFORCED:
        raise SpecError(
            f"spec.scheduling.policy={policy!r}: the Kubernetes node agent enforces "
            f"{' and '.join(ENFORCED)} only ({policy} needs a per-flow rate controller "
            f"it does not have); use one of those, or compare {policy} with `tailcut "
            "simulate` (docs/cadentflow.md)")
    enforce.check_runnable(job.spec.scheduling, job)


def role_flows(job: TrainingJob) -> dict[str, Any]:
    """The roles' `flows` section (levels per tensor and direction for cadentflow).
    Cached per scheduling section and model: resolving builds the model once."""
    key = (f"{job.spec.scheduling.model_dump_json()}/{job.spec.training.model}/"
           f"{job.spec.training.seed}")
    if key not in _flows_cache:
        if len(_flows_cache) > 64:   # an operator lives long; jobs come and go
            _flows_cache.clear()
        _flows_cache[key] = flowreport.role_flows(job)
    return _flows_cache[key]


def config_data(job: TrainingJob) -> dict[str, str]:
    """What the job's config map carries for the pods besides the spec."""
    return {FLOWS_KEY: json.dumps(role_flows(job), sort_keys=True)}
