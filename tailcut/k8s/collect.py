"""`tailcut collect JOB`: a finished TrainingJob's results, from its pods' logs.

Assembles the results directory `tailcut run` leaves, on any cluster (kind included):
each role's files come from the block at the end of its pod's log
(tailcut.k8s.podresults); metrics.json from the PS's "done" event and those files,
built and written by tailcut.reports.runmetrics as under `tailcut run`; spec.yaml from the
job's config map; loss.png and the IMC'20 dissection plots are drawn here with the same
report code; each pod's whole log goes to logs/<replica>.log. Each role's TCP counters
(tcp-<pod>.json, in its block) become tcp_counters.csv and metrics.json's
"tcp_counters", as under `tailcut run`; their CPU times (cpu-<pod>.json) metrics.json's
"cpu".
"""

import json
import time
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from tailcut import plan, spec
from tailcut.errors import TailcutError
from tailcut.k8s import podresults
from tailcut.k8s.manifests import resources
from tailcut.fidelity import verdict
from tailcut.reports import runmetrics
from tailcut.scheduling import flowreport
from tailcut.training import cpustats, delivery, tcpstats

Progress = Callable[[str], None]


class CollectError(TailcutError):
    """The job's results cannot be collected; the message says which pod and why."""


def _clients(kubeconfig: Optional[str]) -> tuple[Any, Any]:
    import kubernetes   # here: the rest of tailcut does not need the client
    kubernetes.config.load_kube_config(config_file=kubeconfig)
    return kubernetes.client.CoreV1Api(), kubernetes.client.ApiException


def collect(job_name: str, namespace: str, kubeconfig: Optional[str], results_dir: Path,
            progress: Progress = print) -> Path:
    core, api_error = _clients(kubeconfig)
    pods = core.list_namespaced_pod(
        namespace, label_selector=f"{resources.LABEL_JOB}={job_name}").items
    roles = [p for p in pods if (p.metadata.labels or {}).get(resources.LABEL_ROLE)
             in ("ps", "worker", "replica", "aggregator")]
    if not roles:
        raise CollectError(f"no pods of TrainingJob {namespace}/{job_name} (is the name "
                           "right? deleting the job deletes its pods and their logs)")
    running = [p.metadata.name for p in roles
               if p.status.phase not in ("Succeeded", "Failed")]
    if running:
        raise CollectError(f"{', '.join(sorted(running))} still running: collect once "
                           f"the job has ended (kubectl get tj {job_name} -n {namespace})")
    try:
        cm = core.read_namespaced_config_map(f"{job_name}-spec", namespace)
        # a cluster's config map may name a module: never imported here
        job = spec.from_dict(yaml.safe_load(cm.data[resources.SPEC_KEY]),
                             import_modules=False)
    except api_error as err:
        raise CollectError(f"config map {job_name}-spec: {err.status} {err.reason}") from err
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "logs").mkdir(exist_ok=True)
    (results_dir / "spec.yaml").write_text(cm.data[resources.SPEC_KEY])
    missing, done = [], None
    for pod in sorted(roles, key=lambda p: p.metadata.name):
        replica = pod.metadata.labels[resources.LABEL_REPLICA]
        log = core.read_namespaced_pod_log(pod.metadata.name, namespace)
        (results_dir / "logs" / f"{replica}.log").write_text(log)
        try:
            names = podresults.unpack(pod.metadata.name, log.splitlines(), results_dir)
            progress(f"{pod.metadata.name}: {len(names)} files")
        except podresults.ResultsError as err:
            missing.append(str(err))
            progress(f"warning: {err}")
        if replica == plan.leader(job):   # ps-0, or worker-0 under allreduce
            done = _done_event(log)
    if done is None:
        leader = plan.leader(job)
        raise CollectError(f"{job_name}-{leader}: its log has no \"done\" event: the job "
                           f"did not finish (see logs/{leader}.log)")
    write_report(job, done, results_dir, progress)
    if missing:
        progress(f"{len(missing)} pod(s) without results: " + "; ".join(missing))
    return results_dir


def _done_event(log: str) -> Optional[dict[str, Any]]:
    for line in reversed(log.splitlines()):
        if line.startswith("{") and '"done"' in line:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "done":
                return dict(event)
    return None


def write_report(job: spec.TrainingJob, done: dict[str, Any], results_dir: Path,
                 progress: Progress) -> None:
    """metrics.json, loss.png and the dissection plots, as `tailcut run` writes them."""
    from tailcut.reports import dissection, plots   # matplotlib is slow to import
    # the verdict from the host CPU the leader's node saw (links not sampled here)
    host = done.get("host")
    scheduling = flowreport.summarize(results_dir, job.spec.scheduling.policy)
    # The pods ran on the cluster's nodes, whose cores this machine cannot count.
    metrics = runmetrics.build(
        job, done, results_dir, backend="kubernetes", cores=0, scheduling=scheduling,
        fidelity=verdict.judge(host=host if isinstance(host, dict) else None))
    runmetrics.write(results_dir, metrics)
    # and the per-flow summary beside it, as `tailcut run` leaves it
    (results_dir / "flows.json").write_text(json.dumps(scheduling, indent=2) + "\n")
    progress(flowreport.describe(scheduling))
    if "delivery" in metrics:
        progress(delivery.describe(metrics["delivery"], job.spec.transport.type))
    progress(("control channel " if "delivery" in metrics else "")
             + tcpstats.describe(metrics["tcp_counters"]))
    progress(cpustats.describe(metrics["cpu"]))
    for line in verdict.describe(metrics["fidelity"]):
        progress(line)
    if (results_dir / "epochs.csv").exists() and int(done["epochs"]) > 0:
        plots.plot_loss_vs_epoch(
            results_dir / "epochs.csv", results_dir / "loss.png",
            title=f"{job.name}: {job.spec.training.model} over {job.spec.transport.type}")
    if not job.spec.training.mode.has_ps:   # no RPCs: the all-reduce times
        from tailcut.reports import allreduce_report
        try:
            progress(allreduce_report.describe(allreduce_report.report(
                results_dir, job.spec.replicas.workers, title=job.name)))
        except (OSError, ValueError) as err:
            progress(f"no all-reduce report: {err}")
        return
    try:
        written = dissection.report(results_dir, title=job.name)
        progress("dissection: " + ", ".join(p.name for p in written))
    except (OSError, ValueError) as err:
        progress(f"no dissection report: {err}")


def default_dir(job_name: str) -> Path:
    return Path("results") / f"{job_name}-k8s-{time.strftime('%Y%m%d-%H%M%S')}"
