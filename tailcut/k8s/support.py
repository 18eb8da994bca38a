"""What the Kubernetes path runs, checked before the operator creates anything.

The pods run workers/entrypoint.py unprivileged (no capabilities: no XDP, no BPF) and
reach each other by DNS name, and the entrypoint builds a plain PS-and-workers job.
Jobs that need more are refused by name here rather than failing later in a pod:

- `spec.transport.type` udp or bounded-loss: the datagram transports attach the XDP
  counter from the receiving process and bind to the pod's own address;
- `spec.replicas.parameterServers` > 1, `psReplica`, `aggregators`: the entrypoint
  wires ps-0 and workers only.

All of these run with `tailcut run` on one host (docs/kubernetes.md).
"""

from tailcut.errors import SpecError
from tailcut.spec.model import TrainingJob

TRANSPORTS = ("tcp", "app-drop")   # TCP underneath: no privileges, no own address


def check(job: TrainingJob) -> None:
    """Raise SpecError naming the first field the Kubernetes path cannot honour."""
    transport = job.spec.transport.type
    if transport not in TRANSPORTS:
        raise SpecError(
            f"spec.transport.type={transport!r}: the Kubernetes path runs "
            f"{' and '.join(TRANSPORTS)} only (the datagram transports attach XDP from an "
            "unprivileged pod); run this job with `tailcut run`")
    r = job.spec.replicas
    for field, value, unsupported in (
            ("parameterServers", r.parameter_servers, r.parameter_servers > 1),
            ("psReplica", r.ps_replica, r.ps_replica),
            ("aggregators", len(r.aggregators), bool(r.aggregators))):
        if unsupported:
            raise SpecError(
                f"spec.replicas.{field}={value!r}: the Kubernetes path runs one parameter "
                "server and its workers only; run sharded, replicated or aggregated jobs "
                "with `tailcut run`")
