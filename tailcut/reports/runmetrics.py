"""metrics.json: the one document a finished run leaves, whichever executor ran it.

`tailcut run` (tailcut.runtime.local) and `tailcut collect` (tailcut.k8s.collect) both
build it here, from the leader's "done" event, the job's spec and the files its roles
left in the results directory, so that `tailcut compare`, `tailcut reproduce`, the
operator, the reports and the tests read the same fields from either:

    job, results_dir, backend              "local" (`tailcut run`) or "kubernetes"
    converged, jct_s, epochs, iterations, final_accuracy, final_loss   the done event
    tcp_retrans_segs, tcp_rto_timeouts     the pods' totals; None if no pod reported
    fidelity                               tailcut.fidelity.verdict's, from the executor
    transport, model, target_accuracy      the spec
    parameter_servers, sync_mode, staleness, ordering, aggregators, ps_replica,
    finished_by, takeover                  the roles (docs/roles.md)
    scheduling                             tailcut.scheduling.flowreport's, from the executor
    tcp_counters, cpu                      tailcut.training.tcpstats's and cpustats's
    delivery                               datagram transports only (training.delivery)
    ...                                    what only one executor measures, as `extra`
                                           (local: rtt with a delay, overhead_s)

    doc = runmetrics.build(job, done, results_dir, backend="local",
                           fidelity=verdict, scheduling=flows)
    runmetrics.write(results_dir, doc)
"""

import json
from pathlib import Path
from typing import Any, Mapping, Optional

from tailcut.spec import transport_kinds
from tailcut.spec.model import TrainingJob
from tailcut.training import cpustats, delivery, tcpstats

FILE = "metrics.json"
BACKENDS = ("local", "kubernetes")


def build(job: TrainingJob, done: Mapping[str, Any], results_dir: Path, *, backend: str,
          fidelity: Optional[dict[str, Any]], scheduling: Optional[dict[str, Any]],
          cores: Optional[int] = None,
          extra: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """The document of `job`'s run that ended with `done` (the leader's "done" event),
    its roles' files in `results_dir` (tcp_counters.csv is written there on the way).
    `cores`: the cores the roles could use, for cpu's ``busy`` (this machine's unless
    given; 0: unknown, pods on a cluster's nodes)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: one of {', '.join(BACKENDS)}")
    pods = job.spec.pod_names()
    jct_s = float(done["jct_s"])
    tcp = tcpstats.summarize(results_dir, pods)
    reported = bool(tcp["pods"])
    doc: dict[str, Any] = {
        "job": job.name, "results_dir": str(results_dir), "backend": backend,
        "converged": bool(done["converged"]), "jct_s": jct_s,
        "epochs": int(done["epochs"]), "iterations": int(done["iterations"]),
        "final_accuracy": float(done["final_accuracy"]),
        "final_loss": float(done["final_loss"]),
        "tcp_retrans_segs": tcp["total"]["retrans_segs"] if reported else None,
        "tcp_rto_timeouts": tcp["total"]["rto_timeouts"] if reported else None,
        "fidelity": fidelity,
        "transport": job.spec.transport.type, "model": job.spec.training.model,
        "target_accuracy": job.spec.training.target_accuracy,
        **roles(job, done),
        "scheduling": scheduling,
        "tcp_counters": tcp,
        "cpu": cpustats.summarize(results_dir, pods, jct_s, cores=cores)}
    if _datagrams(job.spec.transport.type, results_dir):
        doc["delivery"] = delivery.summarize(results_dir)
    doc.update(extra or {})
    return doc


def roles(job: TrainingJob, done: Mapping[str, Any]) -> dict[str, Any]:
    """The roles part: shards, sync mode, aggregators, who finished, the take-over."""
    r, t = job.spec.replicas, job.spec.training
    return {"parameter_servers": r.parameter_servers, "sync_mode": t.sync_mode,
            "staleness": t.staleness, "ordering": t.ordering,
            "aggregators": [list(a.workers) for a in r.aggregators],
            "ps_replica": r.ps_replica, "finished_by": done.get("role", "ps-0"),
            "takeover": done.get("takeover")}


def write(results_dir: Path, doc: Mapping[str, Any]) -> Path:
    """Write `doc` as results_dir/metrics.json (again, if a later step adds to it)."""
    path = results_dir / FILE
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def _datagrams(transport: str, results_dir: Path) -> bool:
    """Whether the run's data went as datagrams, so that its delivery counts: as the
    transport says, or, for one this machine does not know (a plugin collected from a
    cluster), whether its roles wrote messages*.csv."""
    try:
        return transport_kinds.get(transport).datagrams
    except ValueError:
        return any(results_dir.glob("messages*.csv"))
