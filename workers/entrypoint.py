"""Entrypoint of a parameter-server or worker pod: turn the job's spec (mounted from the
operator's config map) and this pod's replica name into a RoleConfig, then run the role.

    python workers/entrypoint.py --spec /etc/tailcut/spec.yaml --replica worker-2

The PS listens on every address of its pod; workers reach it as ps-0.<job> through the
job's headless service (the pod's hostname and subdomain give it that DNS name). With
spec.scheduling.policy cadentflow the role sends one DSCP-tagged frame per tensor, at
the levels of the config map's flows.json (tailcut.k8s.policy), as under `tailcut run`.
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from tailcut import spec
from tailcut.k8s import podresults, policy, resources
from tailcut.net import topology
from tailcut.runtime import local
from tailcut.training import role
from tailcut.training.config import RoleConfig


def role_config(job: spec.TrainingJob, replica: str, results_dir: str,
                flows: Optional[dict[str, Any]] = None) -> RoleConfig:
    kind, _, index = replica.rpartition("-")
    t = job.spec.training
    ps_host = "0.0.0.0" if kind == "ps" else f"ps-0.{job.name}"
    return RoleConfig(
        job=job.name, role=kind, index=int(index), ps_host=ps_host,
        ps_port=resources.PS_PORT, num_workers=job.spec.replicas.workers, model=t.model,
        batch_size=t.batch_size, learning_rate=t.learning_rate, max_epochs=t.epochs,
        max_iterations=t.iterations, target_accuracy=t.target_accuracy, seed=t.seed,
        sync_mode=t.sync_mode,
        transport=local.transport_options(job, topology.plan(job).pod(replica)),
        results_dir=results_dir, timeout_s=t.timeout_s,
        flows=flows if flows is not None else policy.role_flows(job))


def read_flows(spec_path: Path) -> Optional[dict[str, Any]]:
    """The per-tensor tags the operator put next to the spec (config map key
    flows.json), or None to resolve them here from the spec."""
    path = spec_path.parent / policy.FLOWS_KEY
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
    if resources.role_of(args.replica) not in ("ps", "worker"):
        print(f"entrypoint: --replica {args.replica}: this image runs parameter servers and "
              "workers only", file=sys.stderr)
        return 2
    results = os.environ.get("TAILCUT_RESULTS_DIR") or tempfile.mkdtemp(prefix="tailcut-")
    config_path = Path(results) / f"{args.replica}.json"
    role_config(job, args.replica, results, read_flows(args.spec)).to_json(config_path)
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
    """Print the event as the role would; the PS's "done" event also becomes the
    container's termination message, which the operator reads into the job's status
    (tailcut.k8s.resources.figures_from_pods)."""
    role.emit(event)
    if event.get("event") != "done":
        return
    path = Path(os.environ.get("TAILCUT_TERMINATION_LOG", "/dev/termination-log"))
    keys = ("jct_s", "epochs", "iterations", "final_accuracy", "final_loss", "converged")
    try:   # at most 4096 bytes are kept: these few numbers only
        path.write_text(json.dumps({k: event[k] for k in keys if k in event}))
    except OSError as err:   # not on Kubernetes, or no such file: the log has it all
        print(f"entrypoint: termination message not written to {path}: {err}",
              file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
