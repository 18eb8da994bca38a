"""spec.scheduling on Kubernetes: the per-tensor tags the operator hands the PS and
worker pods (what it refuses before creating anything is tailcut.plan's).

- `fair`: nothing to add; pods send whole, untagged messages.
- `cadentflow`: the node agent (tailcut.k8s.agent) puts the HTB priority classes and
  the DSCP classifier on both ends of every link of the job, as `tailcut run` does
  (tailcut.scheduling.enforce.apply_to), and
  the pods send each tensor as its own tagged part (tcp, udp, bounded-loss). They read their levels from the
  job's config map, key flows.json: the `flows` section `tailcut run` gives its roles
  (tailcut.scheduling.flowreport.role_flows), e.g.

      {"policy": "cadentflow", "pull": {"fc1.weight": 0, ...}, "push": {...}}

- `coflow`: nothing on the node; the pods pace each connection at its Varys MADD
  rate (SO_MAX_PACING_RATE), which flows.json also carries:
  {"policy": "coflow", "pace": {"ps-0": {"worker-0": 6.2e6, ...}, ...}} (bytes/s).
"""

import json
from typing import Any

from tailcut import plan
from tailcut.scheduling import runnable
from tailcut.spec.model import TrainingJob

FLOWS_KEY = "flows.json"            # config map key; the pods see SPEC_MOUNT/flows.json
# spec.network.inNetwork resolved once by the operator (tailcut.plan.in_network): the
# pods read it from the config map, the node agents from the job's status.inNetwork.
IN_NETWORK_KEY = "in-network.json"


def check_enforceable(job: TrainingJob) -> None:
    """Refuse what the pods cannot tag or pace (runnable.check_runnable, as `tailcut run`
    does: cadentflow over app-drop, coflow over anything but tcp, either with
    aggregators or a PS replica)."""
    runnable.check_runnable(job.spec.scheduling, job)


def config_data(job: TrainingJob) -> dict[str, str]:
    """What the job's config map carries for the pods besides the spec."""
    data = {FLOWS_KEY: json.dumps(plan.role_flows(job), sort_keys=True)}
    if job.spec.network.in_network is not None:
        data[IN_NETWORK_KEY] = in_network_data(job)
    return data


def in_network_data(job: TrainingJob) -> str:
    """The ToR programs' sections as the config map and status.inNetwork carry them."""
    return json.dumps(plan.in_network(job), sort_keys=True)
