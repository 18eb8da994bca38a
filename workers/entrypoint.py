"""Entrypoint of a parameter-server or worker pod: turn the job's spec (mounted from the
operator's config map) and this pod's replica name into a RoleConfig, then run the role.

    python workers/entrypoint.py --spec /etc/tailcut/spec.yaml --replica worker-2

Every role reaches its peers, and binds its own listeners, by the addresses the job's
topology plans (tailcut.plan.hosts), as under `tailcut run`: the node agent gives the
pod its address on a second interface, tc0, wired into the job's rack on the node;
the entrypoint waits for it (ADDRESS_TIMEOUT_S) before the role starts. With
spec.scheduling.policy cadentflow the role sends one DSCP-tagged frame per tensor, at
the levels of the config map's flows.json (tailcut.k8s.manifests.policy), as under `tailcut run`.
"""

import argparse
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional


def _exit_on_sigterm(signum: int, _frame: Any) -> None:
    """The pod is being deleted, or stopped (its job failed: the operator lowered its
    deadline). The role is the container's PID 1, for which the kernel ignores a signal
    without a handler: without this the kubelet would wait out the grace period (30 s)
    while the role carried on, and a replica would never see its primary go. End at
    once, as a killed process does."""
    print("entrypoint: SIGTERM (the pod is being deleted or stopped): exiting",
          file=sys.stderr, flush=True)
    os._exit(128 + signum)


# Before the imports below, which take a second or more on a busy node: a job that
# fails at once has its pods stopped while they start (met on the cluster: 30 s more
# for pods stopped during their imports).
signal.signal(signal.SIGTERM, _exit_on_sigterm)

from tailcut import plan, spec  # noqa: E402  (after the handler, on purpose)
from tailcut.errors import NetError  # noqa: E402
from tailcut.k8s import podresults  # noqa: E402
from tailcut.k8s.manifests import policy, resources  # noqa: E402
from tailcut.net import address, topology  # noqa: E402
from tailcut.training import role  # noqa: E402
from tailcut.training.config import RoleConfig  # noqa: E402

TRAINING_ROLES = ("ps", "worker", "aggregator", "replica")
# The agent wires a pod once the kubelet reports it running: a second or two; the
# margin covers a node busy starting a job's many pods.
ADDRESS_TIMEOUT_S = float(os.environ.get("TAILCUT_ADDRESS_TIMEOUT_S", "120"))
TERMINATION_BYTES = 4000   # the kubelet keeps at most 4096 bytes of the message


def role_config(job: spec.TrainingJob, replica: str, results_dir: str,
                flows: Optional[dict[str, Any]] = None,
                tor: Optional[dict[str, Any]] = None) -> RoleConfig:
    """The role's configuration from the job's plan (tailcut.plan)."""
    return plan.role_config(job, replica, results_dir, plan.hosts(topology.plan(job)),
                            flows, tor)


def read_flows(spec_path: Path) -> Optional[dict[str, Any]]:
    """The per-tensor tags the operator put next to the spec (config map key
    flows.json), or None to resolve them here from the spec."""
    path = spec_path.parent / policy.FLOWS_KEY
    return json.loads(path.read_text()) if path.exists() else None


def read_in_network(spec_path: Path) -> Optional[dict[str, Any]]:
    """The ToR programs' sections the operator resolved (config map key
    in-network.json: the hot set chosen once), or None to resolve them here."""
    path = spec_path.parent / policy.IN_NETWORK_KEY
    return json.loads(path.read_text()) if path.exists() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--replica", required=True, help="ps-0, worker-3, ...")
    args = parser.parse_args(argv)
    job = spec.load_file(args.spec)
    if args.replica not in job.spec.pod_names():
        print(f"entrypoint: --replica {args.replica}: not a pod of job {job.name} "
              f"({', '.join(job.spec.pod_names())})", file=sys.stderr)
        return 2
    if resources.role_of(args.replica) not in TRAINING_ROLES:
        print(f"entrypoint: --replica {args.replica}: this image runs "
              f"{', '.join(TRAINING_ROLES)} (background pods run tailcut.background.pod)",
              file=sys.stderr)
        return 2
    own_ip = topology.plan(job).pod(args.replica).ip
    try:
        ifname, _ = address.wait_for(ADDRESS_TIMEOUT_S, f"pod {args.replica}", ip=own_ip)
    except NetError as err:
        print(f"entrypoint: {err}", file=sys.stderr)
        return 1
    print(f"entrypoint: {args.replica} is {own_ip} on {ifname}", flush=True)
    results = os.environ.get("TAILCUT_RESULTS_DIR") or tempfile.mkdtemp(prefix="tailcut-")
    config_path = Path(results) / f"{args.replica}.json"
    role_config(job, args.replica, results, read_flows(args.spec),
                read_in_network(args.spec)).to_json(config_path)
    try:
        return int(role.main([str(config_path)], emit=_emit_and_report) or 0)
    finally:
        # The pod's files go with it; its log stays: `tailcut collect` reads them there.
        block, left_out = podresults.pack(args.replica, Path(results))
        if left_out:
            print(f"entrypoint: results too large for the log; left out: "
                  f"{', '.join(left_out)}", file=sys.stderr)
        print(block, flush=True)


def _emit_and_report(event: dict[str, Any]) -> None:
    """Print the event as the role would; the PS's "done" event, or any role's "error"
    event, also becomes the container's termination message, which the operator reads
    into the job's status (tailcut.k8s.manifests.resources: figures_from_pods, and the
    reason a failed job gives). Without it the kubelet would take the log's tail, which
    is the results block (tailcut.k8s.podresults), not the error."""
    role.emit(event)
    if event.get("event") == "done":
        # "tcp": the PS pod's own TCP counters (tailcut.training.tcpstats), eight
        # integers; the job's totals over every pod are in `tailcut collect`'s results;
        # "host": its node's CPU over the training window (seven numbers), the status's
        # fidelity verdict
        keys = ("jct_s", "epochs", "iterations", "final_accuracy", "final_loss",
                "converged", "tcp", "host")
        _write_termination_message(json.dumps({k: event[k] for k in keys if k in event}))
    elif event.get("event") == "error":
        said = str(event.get("message", "")).encode()[:TERMINATION_BYTES]
        _write_termination_message(said.decode(errors="ignore"))


def _write_termination_message(text: str) -> None:
    path = Path(os.environ.get("TAILCUT_TERMINATION_LOG", "/dev/termination-log"))
    if not path.exists():   # the kubelet mounts it; elsewhere (a test as root) never
        return              # create a file in /dev
    try:
        path.write_text(text)
    except OSError as err:   # read-only or full: the log has it all
        print(f"entrypoint: termination message not written to {path}: {err}",
              file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
