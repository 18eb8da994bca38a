"""The tailcut operator: turns TrainingJob resources into pods and records their fate.

Run by path (`kopf run --standalone -A operator/handlers.py`); this directory has no
__init__.py on purpose, since a package named `operator` would shadow the standard
library. Two backends, chosen by TAILCUT_OPERATOR_BACKEND:

- kubernetes (default): records in the job's status the spec generation and the
  racks' placement the node agents build from, then creates the job's config map,
  headless service and PS/worker pods (tailcut.k8s.manifests.resources), all controlled by the
  TrainingJob; follows the pods it controls and writes phase, replica counts and
  conditions into the job's status. It never touches netlink: shaping each pod is the
  node agent's job (tailcut.k8s.agent).
- local: runs the job on this host with the local runtime (`tailcut run`, which needs
  root) and writes progress, JCT and accuracy into the status. For a single-host lab
  with a real API server but no kubelet.

Every handler is idempotent: objects the job already controls are left alone, status
is recomputed from what exists, so a restarted operator picks up where it stopped. An
object of the job's names that the job does not control is never taken over: the job
fails naming it (ObjectNotOwned), and pods the job does not control count for nothing.
"""

import json
import logging
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Optional, Union

import kopf
import kubernetes
import yaml

from tailcut import errors, plan, spec
from tailcut.errors import SpecError
from tailcut.k8s import metrics
from tailcut.k8s.manifests import (background, crd, limits, overlay_ids, placement, policy,
                                   resources, status)

# The chart's operator.watchNamespaces, given to kopf as --namespace for each (empty:
# --all-namespaces). The operator then has a Role in each of them and, cluster-wide,
# only `list nodes`: kopf must not scan namespaces or CRDs (configure()), and overlay
# ids are chosen among the jobs of these namespaces (_record_with_overlay_id()).
WATCH_NAMESPACES = tuple(n for n in os.environ.get("TAILCUT_WATCH_NAMESPACES", "").split(",")
                         if n)

BACKEND = os.environ.get("TAILCUT_OPERATOR_BACKEND", "kubernetes")
WORKER_IMAGE = os.environ.get("TAILCUT_WORKER_IMAGE", "ghcr.io/tailcut/worker:0.1.0")
# The worker image with PyTorch (the chart's workers.torchImage), for the pods of jobs
# with a torch model or DDP/Gloo; empty: this cluster has none, and those jobs fail.
TORCH_IMAGE = os.environ.get("TAILCUT_WORKER_TORCH_IMAGE", "")
RESULTS_DIR = Path(os.environ.get("TAILCUT_RESULTS_DIR", "results"))
TERMINAL = ("Succeeded", "Failed")
# /metrics and /healthz (tailcut.k8s.metrics): the chart sets the port; 0, the default
# out of a cluster, serves none (tests run several operators on one host).
METRICS_PORT = int(os.environ.get("TAILCUT_METRICS_PORT", "0"))
# Whether bounded-loss pods may get the capabilities their XDP counter needs (the
# chart's workers.xdp.enabled; tailcut.k8s.manifests.resources.XDP_CAPABILITIES).
XDP_ALLOWED = os.environ.get("TAILCUT_WORKER_XDP", "true") == "true"
# What every container of a job's pods requests (the chart's workers.resources, JSON):
# a namespace with a ResourceQuota on requests admits only pods that state them.
WORKER_RESOURCES: dict[str, Any] = json.loads(os.environ.get("TAILCUT_WORKER_RESOURCES")
                                              or json.dumps(resources.DEFAULT_RESOURCES))
# What one job may ask of the nodes' kernels (the chart's operator.limits, JSON:
# linkQueueBytes, jobQueueBytes, racksPerNode, linksPerJob); a namespace's annotations
# override them (tailcut.k8s.manifests.limits).
LIMITS = limits.Limits().overridden(json.loads(os.environ.get("TAILCUT_LIMITS") or "{}"),
                                    "TAILCUT_LIMITS")
# A create the API server refuses (a quota, an admission webhook, a server error) is
# tried this many times, backing off 1, 2, 4, ... s, then fails the job in its words.
CREATE_ATTEMPTS = 5
PROGRESS_EVERY_S = 5.0   # how often a running job's progress is read from its PS's log
Logger = Union[logging.Logger, "logging.LoggerAdapter[Any]"]
_EPOCH = re.compile(r"^epoch\s+(\d+)/(\d+)")
_local_runs: dict[tuple[str, str], subprocess.Popen[str]] = {}
_lock = threading.Lock()
_phases_posted: dict[tuple[str, str, Optional[str]], str] = {}   # the last phase evented
# Held while an overlay id is chosen and recorded: reconciles of different jobs run in
# parallel threads, and each must see the ids the others recorded.
_overlay_lock = threading.Lock()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Keep kopf's bookkeeping in annotations: the status schema is ours and strict.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="tailcut.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="tailcut.dev", key="last-handled-configuration")
    # Kubernetes events only for what a person must see (kopf.warn below: a spec the
    # API server let through but the models refuse, a failed pod), not every log line.
    settings.posting.loggers = False
    settings.watching.server_timeout = 300
    # Only the pods of jobs, selected by the API server: the handlers' labels= filter
    # alone is applied by kopf after every pod of the cluster has come down the watch.
    settings.watching.label_selectors["v1", "pods"] = resources.LABEL_JOB
    settings.execution.max_workers = 8
    if WATCH_NAMESPACES:
        # kopf --namespace: the watched namespaces are taken as named (they need not
        # exist yet), not found by listing every namespace, and the CRDs are scanned
        # once through discovery, not watched: no cluster-wide reads (kopf's
        # "restricted mode", which it would otherwise fall back to with warnings).
        settings.scanning.disabled = True
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    if METRICS_PORT:
        # /metrics for Prometheus (the chart's Service)
        metrics.serve(metrics.operator_registry, METRICS_PORT)


@kopf.on.resume(crd.GROUP, crd.VERSION, crd.PLURAL)
@kopf.on.create(crd.GROUP, crd.VERSION, crd.PLURAL)
def reconcile(body: kopf.Body, patch: kopf.Patch, logger: Logger, retry: int = 0,
              **_: Any) -> None:
    """Make the job's objects exist, then record its phase (timed, errors counted)."""
    with metrics.reconcile_seconds.time():
        try:
            _reconcile(body, patch, logger, last_try=retry + 1 >= CREATE_ATTEMPTS,
                       retry=retry)
        except Exception:
            metrics.reconcile_errors.inc()
            raise
    if "phase" in patch.status:
        metrics.job_phases.set(body["metadata"]["namespace"], body["metadata"]["name"],
                               patch.status["phase"])


def _reconcile(body: kopf.Body, patch: kopf.Patch, logger: Logger, last_try: bool = False,
               retry: int = 0) -> None:
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    old = dict(body.get("status") or {})
    if old.get("phase") in TERMINAL:
        return  # finished jobs stay as they ended, across operator restarts
    # The generation the job's objects are made from: once recorded, a later spec
    # change (not applied) does not move what the status says it describes.
    generation = old.get("specGeneration") or body["metadata"].get("generation")
    try:
        job = _job_of(body, name, source=f"{namespace}/{name}")
        # What this backend cannot build (the local one: what `tailcut run` refuses).
        plan.check(job, "kubernetes" if BACKEND == "kubernetes" else "local")
        if BACKEND == "kubernetes" and plan.needs_torch(job) and not TORCH_IMAGE:
            what = ("spec.training.syncMode=allreduce (DDP over Gloo)"
                    if not job.spec.training.mode.has_ps
                    else f"spec.training.model={job.spec.training.model} (a torch model)")
            raise SpecError(
                f"{what}: its pods need the worker image with PyTorch, and this "
                "cluster's tailcut chart names none (workers.torchImage is empty); "
                "build it with `tailcut images build --torch` (workers/torch.Dockerfile) "
                "and set workers.torchImage=worker-torch (docs/pytorch.md), or run "
                "the job with `tailcut run`")
        if BACKEND == "kubernetes" and plan.needs_xdp(job) and not XDP_ALLOWED:
            raise SpecError(
                f"spec.transport.type={job.spec.transport.type!r}: this cluster's tailcut "
                "chart sets workers.xdp.enabled=false, so the receiving pods may not get "
                "the BPF, NET_ADMIN and PERFMON capabilities the XDP counter needs; use "
                "tcp, udp or app-drop here, or enable it (docs/kubernetes.md, the "
                "privileges)")
    except SpecError as err:
        # The CRD schema lets through what only the models check (cross-field rules).
        _fail_uncreated(body, patch, old, "InvalidSpec", str(err), generation)
        return
    patch.status["backend"] = BACKEND
    if BACKEND == "local":
        _start_local(job, namespace, old, patch, generation, logger)
        return
    owner = resources.owner_reference(body)
    uid = body["metadata"]["uid"]
    core = kubernetes.client.CoreV1Api()
    if plan.needs_xdp(job):
        refused = _xdp_refusal(core, namespace, job)
        if refused:
            _fail_uncreated(body, patch, old, "BoundedLossNotAllowed", refused, generation)
            return
    where = _record_placement(core, job, namespace, generation)
    if not old.get("phase"):   # checked once, before anything is created
        asked = _limit_refusal(core, namespace, job, where)
        if isinstance(asked, str):
            _fail_uncreated(body, patch, old, "KernelLimitExceeded", asked, generation)
            return
        # Now, not with the handler's patch: the pods' events write the status as soon
        # as they exist.
        kubernetes.client.CustomObjectsApi().patch_namespaced_custom_object_status(
            crd.GROUP, crd.VERSION, namespace, crd.PLURAL, name,
            {"status": {"queueMemoryBytes": asked}})
    try:
        _create(core.create_namespaced_config_map, core.read_namespaced_config_map,
                namespace, resources.config_map(job, owner), uid)
        _create(core.create_namespaced_service, core.read_namespaced_service, namespace,
                resources.service(job, owner), uid)
        bg = _create_background(core, job, namespace, owner, patch, where)
        # Background load's pods and sidecars run no torch: the small image.
        image = TORCH_IMAGE if plan.needs_torch(job) else WORKER_IMAGE
        for pod in background.with_sidecars(job, bg, resources.pods(
                job, owner, image, where=where, container_resources=WORKER_RESOURCES),
                WORKER_IMAGE, container_resources=WORKER_RESOURCES):
            _create(core.create_namespaced_pod, _read_pod(core), namespace, pod, uid)
    except _Refused as err:
        # E.g. a namespace whose Pod Security level forbids the capabilities of a
        # bounded-loss pod (the API server's words name the rule), or an object of the
        # job's name that someone else made: retrying cannot fix either.
        _fail_uncreated(body, patch, old, err.reason, str(err), generation)
        return
    except _Retry as err:
        # Refused for a reason that may pass (a quota, a webhook, the server): tried
        # again a few times, each a Warning event, then the job fails in its words.
        if last_try:
            message = f"{err} (tried {CREATE_ATTEMPTS} times)"
            _fail_uncreated(body, patch, old, "CreateFailed", message, generation)
            return
        kopf.warn(body, reason="CreateRetrying", message=f"{err}; trying again")
        raise kopf.TemporaryError(str(err), delay=2 ** retry) from err
    _record_pods(job, _owned_pods(core, namespace, name, uid), old, patch, generation)
    if not old.get("phase"):
        kopf.info(body, reason="Created", message="pods, service and config map created")


@kopf.on.update(crd.GROUP, crd.VERSION, crd.PLURAL, field="spec")
def spec_changed(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    """A running job's pods are not rebuilt: say so instead of silently ignoring it.
    observedGeneration stays at the spec the pods were made from: nothing applied the
    new one."""
    patch.status["message"] = (
        f"spec changed (generation {body['metadata'].get('generation')}) after the job "
        "started; the change is not applied (delete and re-create the TrainingJob to "
        "rerun)")


@kopf.on.event("pods", labels={resources.LABEL_JOB: kopf.PRESENT})
def pod_event(body: kopf.Body, logger: Logger, **_: Any) -> None:
    """A pod of a job changed: recompute that job's status from all of its pods."""
    if BACKEND != "kubernetes":
        return
    _refresh_from_pods(body["metadata"]["namespace"],
                       body["metadata"]["labels"][resources.LABEL_JOB], logger)


def _refresh_from_pods(namespace: str, name: str, logger: Logger) -> None:
    api = kubernetes.client.CustomObjectsApi()
    try:
        tj: dict[str, Any] = api.get_namespaced_custom_object(  # type: ignore[assignment]
            crd.GROUP, crd.VERSION, namespace, crd.PLURAL, name)
    except kubernetes.client.ApiException as err:
        if err.status == 404:
            return  # the job is gone; its pods go with it (ownerReferences)
        raise
    old = dict(tj.get("status") or {})
    try:
        job = _job_of(tj, name)
    except SpecError:
        return  # reconcile() already failed the job with the reason
    api_pods = _owned_pods(kubernetes.client.CoreV1Api(), namespace, name,
                           tj["metadata"]["uid"])
    if old.get("phase") in TERMINAL:
        # The workers finished first; ps-0's final figures came after, and the node
        # agents record each pod's queue drops as they release it: add only those.
        late = {} if "jctSeconds" in old else resources.figures_from_pods(job, api_pods)
        drops = resources.queue_drops_from_pods(api_pods)
        if drops and drops != old.get("queueDrops"):
            late["queueDrops"] = drops
        if late:
            api.patch_namespaced_custom_object_status(
                crd.GROUP, crd.VERSION, namespace, crd.PLURAL, name, {"status": late})
        return
    figures = resources.figures_from_pods(job, api_pods)
    new: dict[str, Any] = {}
    _record_pods(job, api_pods, old, new,
                 old.get("specGeneration") or tj["metadata"].get("generation"))
    new.update(figures)
    if any(old.get(k) != v for k, v in new.items() if k != "conditions") or \
            _conditions_changed(old, new):
        api.patch_namespaced_custom_object_status(
            crd.GROUP, crd.VERSION, namespace, crd.PLURAL, name, {"status": new})
        metrics.job_phases.set(namespace, name, new["phase"])
        if new["phase"] != old.get("phase"):
            logger.info(f"{namespace}/{name}: {new['phase']}")
            _phase_event(tj, new)
        for replica, said in (new.get("wiringErrors") or {}).items():
            if said and said != (old.get("wiringErrors") or {}).get(replica):
                kopf.warn(tj, reason="WiringFailed",  # type: ignore[arg-type]
                          message=f"{resources.pod_name(job, replica)}: {said}")
        if new["phase"] in TERMINAL:
            _stop_pods(namespace, api_pods, logger, failed=new["phase"] == "Failed")


@kopf.timer(crd.GROUP, crd.VERSION, crd.PLURAL, interval=PROGRESS_EVERY_S,
            initial_delay=PROGRESS_EVERY_S)
def follow_progress(body: kopf.Body, patch: kopf.Patch, logger: Logger, **_: Any) -> None:
    """Kubernetes backend, while the job runs: the epoch the PS reached, from the end of
    its log (the pods have no API access to report it themselves). A job whose failed
    pods wait for their cause (resources.PEER_GONE_GRACE_S) is looked at again: no pod
    event may come once the wait is over."""
    old = dict(body.get("status") or {})
    if BACKEND != "kubernetes" or old.get("phase") != "Running":
        return
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    if any(c.get("type") == "Running" and c.get("reason") == resources.REASON_AWAITING_CAUSE
           for c in old.get("conditions") or []):
        _refresh_from_pods(namespace, name, logger)
        return
    try:
        job = _job_of(body, name)
    except SpecError:
        return
    core = kubernetes.client.CoreV1Api()
    # Only the job's own pods speak for it: a pod of ps-0's name made by someone else
    # once ps-0 is gone must not write its progress.
    ours = {p["metadata"]["name"] for p in _owned_pods(core, namespace, name,
                                                        body["metadata"]["uid"])}
    # ps-0 reports epochs; once it is lost, the replica that took over does.
    for replica in ("ps-0", "replica-0") if job.spec.replicas.ps_replica else ("ps-0",):
        if resources.pod_name(job, replica) not in ours:
            continue
        try:
            log = core.read_namespaced_pod_log(
                resources.pod_name(job, replica), namespace, tail_lines=40)
        except kubernetes.client.ApiException:
            continue   # not started yet, or gone: the next tick or pod event says
        fields = resources.progress_from_log(job, log)
        if fields and fields.get("epoch", 0) > old.get("epoch", -1):
            patch.status.update(fields)
            return


def _phase_event(tj: dict[str, Any], status_now: dict[str, Any]) -> None:
    """A Kubernetes Event on the TrainingJob for each phase it enters (`kubectl
    describe tj` lists them): Warning for Failed, Normal otherwise. Once per phase:
    the events of several pods can report the same change at the same time."""
    phase = status_now["phase"]
    key = (tj["metadata"]["namespace"], tj["metadata"]["name"], tj["metadata"].get("uid"))
    with _lock:
        if _phases_posted.get(key) == phase:
            return
        _phases_posted[key] = phase
    message = status_now.get("message") or phase
    if "jctSeconds" in status_now:
        message += (f"; JCT {status_now['jctSeconds']} s, accuracy "
                    f"{status_now.get('accuracy')}")
    if phase == "Failed":   # the Failed condition's reason: PodFailed, NodeUnfit
        reason = next((c.get("reason") for c in status_now.get("conditions") or []
                       if c.get("type") == "Failed" and c.get("status") == "True"),
                      None) or "PodFailed"
        kopf.warn(tj, reason=reason, message=message)  # type: ignore[arg-type]
    else:
        kopf.info(tj, reason=phase, message=message)  # type: ignore[arg-type]


@kopf.on.event("pods", annotations={background.ANNOTATION: kopf.PRESENT})
def background_pod_event(body: kopf.Body, logger: Logger, **_: Any) -> None:
    """A pod with background containers changed: record the background pods' phases
    and the servers' sent reports in status.background, also after the job ended
    (the servers report when they stop, which is when the job ends)."""
    if BACKEND != "kubernetes":
        return
    namespace = body["metadata"]["namespace"]
    name = body["metadata"]["labels"][resources.LABEL_JOB]
    api = kubernetes.client.CustomObjectsApi()
    try:
        tj: dict[str, Any] = api.get_namespaced_custom_object(  # type: ignore[assignment]
            crd.GROUP, crd.VERSION, namespace, crd.PLURAL, name)
        api_pods = _owned_pods(kubernetes.client.CoreV1Api(), namespace, name,
                               tj["metadata"]["uid"])
        api.patch_namespaced_custom_object_status(
            crd.GROUP, crd.VERSION, namespace, crd.PLURAL, name,
            {"status": {"background": background.pods_summary(api_pods)}})
    except kubernetes.client.ApiException as err:
        if err.status != 404:   # the job is gone; its pods go with it
            logger.warning(f"background status of {namespace}/{name}: {err.status} "
                           f"{err.reason}")


@kopf.on.delete(crd.GROUP, crd.VERSION, crd.PLURAL, optional=True)
def deleted(body: kopf.Body, **_: Any) -> None:
    """Local backend: stop the run (it tears its network down on SIGTERM). Kubernetes
    removes the pods itself through their ownerReferences."""
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    with _lock:
        proc = _local_runs.pop(key, None)
        _phases_posted.pop((*key, body["metadata"].get("uid")), None)
    metrics.job_phases.forget(*key)
    if proc is not None and proc.poll() is None:
        proc.terminate()


class _Refused(Exception):
    """The API server refused an object, or one of its name is someone else's, for a
    reason retrying cannot fix; `reason` is the Failed condition's."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class _Retry(Exception):
    """The API server refused to create an object; trying again may pass (a quota
    frees up, a webhook comes back). The message is the server's words."""


def _job_of(obj: Any, name: str, source: str = "<dict>") -> spec.TrainingJob:
    """The TrainingJob of a custom resource's body. A tenant's `training.module` is
    checked for its form and never imported here: it runs in the job's own pods."""
    return spec.from_dict({"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                           "metadata": {"name": name}, "spec": dict(obj["spec"])},
                          source=source, import_modules=False)


def _api_words(err: Any) -> str:
    """What the API server said (its Status message: a quota's, an admission webhook's
    denial), else the HTTP status."""
    try:
        message = json.loads(err.body or "").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or f"{err.status} {err.reason}")


def _fail_uncreated(body: kopf.Body, patch: Any, old: dict[str, Any], reason: str,
                    message: str, generation: Optional[int]) -> None:
    """The job fails before all of its objects exist (Created False, with the same
    reason) and a Warning event says why (`kubectl describe` shows it)."""
    _set_status(patch, old, "Failed", reason, message, generation, created=False)
    kopf.warn(body, reason=reason, message=status.capped(message))


def _xdp_refusal(core: Any, namespace: str, job: spec.TrainingJob) -> Optional[str]:
    """Why a bounded-loss job may not run in `namespace` (None: it may). Its receiving
    pods get root with BPF, NET_ADMIN and PERFMON: besides the chart allowing it
    (workers.xdp.enabled, checked with the spec), the namespace must opt in with a
    label, which only those who may label namespaces (cluster admins, as for Pod
    Security) can set."""
    transport = f"spec.transport.type={job.spec.transport.type!r}"
    labels = core.read_namespace(namespace).metadata.labels or {}
    if labels.get(resources.LABEL_NAMESPACE_XDP) == resources.XDP_ALLOWED_VALUE:
        return None
    return (f"{transport}: namespace {namespace} has not opted in to bounded-loss pods "
            f"(root with the BPF, NET_ADMIN and PERFMON capabilities): a cluster admin "
            f"allows it with `kubectl label namespace {namespace} "
            f"{resources.LABEL_NAMESPACE_XDP}={resources.XDP_ALLOWED_VALUE}` (and a Pod "
            "Security level of privileged there); or use tcp, udp or app-drop "
            "(docs/kubernetes.md, Pod Security)")


def _limit_refusal(core: Any, namespace: str, job: spec.TrainingJob,
                   where: placement.Placement) -> Union[str, int]:
    """Why the job asks more of the nodes' kernels than `namespace` allows
    (tailcut.k8s.manifests.limits), or, if it does not, the bytes its link queues may
    hold (for status.queueMemoryBytes)."""
    annotations = core.read_namespace(namespace).metadata.annotations or {}
    try:
        allowed = LIMITS.overridden(annotations, f"namespace {namespace}'s annotation")
    except ValueError as err:
        return str(err)
    per_node = limits.racks_per_node(len(placement.occupied_racks(job)),
                                     {rack: node.name for rack, node in where.items()})
    return limits.refusal(job, per_node, allowed) or limits.ask(job, per_node).job_queue_bytes


def _create(create: Any, read: Any, namespace: str, manifest: dict[str, Any],
            uid: str) -> None:
    """Create the object, or find it made by this job before (a restart, a retry).
    One of its name that this TrainingJob does not control is never taken over."""
    kind, name = manifest["kind"], manifest["metadata"]["name"]
    try:
        create(namespace, manifest)
        return
    except kubernetes.client.ApiException as err:
        if err.status == 403 and "violates PodSecurity" in (err.body or ""):
            raise _Refused("PodForbidden", f"{kind} {name}: {_api_words(err)}") from err
        if err.status != 409:
            raise _Retry(f"creating {kind} {name}: {_api_words(err)}") from err
    existing = kubernetes.client.ApiClient().sanitize_for_serialization(
        read(name, namespace))
    if resources.controller_uid(existing) == uid:
        return   # ours, from before a restart
    refs = (existing.get("metadata") or {}).get("ownerReferences") or []
    if any(r.get("controller") and r.get("kind") == "TrainingJob"
           and r.get("name") == manifest["metadata"]["ownerReferences"][0]["name"]
           for r in refs):
        # An earlier TrainingJob of this name: the garbage collector removes what it
        # controlled (its owner is gone), then the retry creates ours.
        raise kopf.TemporaryError(f"{kind} {namespace}/{name} belongs to an earlier "
                                  "TrainingJob of this name; waiting for the garbage "
                                  "collector to remove it", delay=5)
    raise _Refused("ObjectNotOwned", (
        f"{kind} {namespace}/{name} already exists and this TrainingJob (uid {uid}) "
        "does not control it: the operator takes over nothing it did not create. "
        f"Delete that {kind} or give the job another name, then re-create the "
        "TrainingJob"))


def _read_pod(core: Any) -> Any:
    """A pod by name, as the operator may read one: with its list right (it is granted
    no get on pods)."""
    def read(name: str, namespace: str) -> Any:
        found = core.list_namespaced_pod(namespace, field_selector=f"metadata.name={name}")
        if not found.items:   # gone since the 409: nobody's, the retry creates it
            raise kopf.TemporaryError(f"pod {namespace}/{name} vanished", delay=1)
        return found.items[0]
    return read


def _owned_pods(core: Any, namespace: str, name: str, uid: str) -> list[dict[str, Any]]:
    """The job's own pods, as the API returns them (camelCase dicts): those its label
    finds that the TrainingJob with `uid` controls (resources.owned_pods)."""
    pods = core.list_namespaced_pod(namespace, label_selector=f"{resources.LABEL_JOB}={name}")
    client = kubernetes.client.ApiClient()
    return resources.owned_pods(name, uid, [client.sanitize_for_serialization(p)
                                            for p in pods.items])


def _record_placement(core: Any, job: spec.TrainingJob, namespace: str,
                      generation: Optional[int]) -> placement.Placement:
    """Each rack's node (tailcut.k8s.manifests.placement): a rack's pods share its node. The
    first reconcile records it, with the spec's generation, in the job's status
    before anything is created: the node agents build from there, and a retry's pods
    land where the first ones did. Read fresh: a retry's body may predate it."""
    api = kubernetes.client.CustomObjectsApi()
    tj: dict[str, Any] = api.get_namespaced_custom_object(  # type: ignore[assignment]
        crd.GROUP, crd.VERSION, namespace, crd.PLURAL, job.name)
    recorded = tj.get("status") or {}
    if recorded.get("specGeneration") is not None:
        if recorded.get(overlay_ids.STATUS_FIELD) is None:   # recorded by an older operator
            _record_with_overlay_id(api, namespace, job.name, {})
        return placement.from_status(recorded.get("placement") or {})
    nodes = core.list_node().items
    where = placement.place(job, namespace, placement.schedulable(
        [kubernetes.client.ApiClient().sanitize_for_serialization(n) for n in nodes]))
    recorded = {"specGeneration": generation, "placement": placement.to_status(where)}
    if job.spec.network.in_network is not None:   # the hot set chosen here, once
        recorded["inNetwork"] = policy.in_network_data(job)
    _record_with_overlay_id(api, namespace, job.name, recorded)
    return where


def _record_with_overlay_id(api: Any, namespace: str, name: str,
                            fields: dict[str, Any]) -> None:
    """Write `fields` into the job's status with an overlay id (its VXLAN's VNI) that no
    other TrainingJob of the cluster holds (tailcut.k8s.manifests.overlay_ids; with
    WATCH_NAMESPACES, of those namespaces: no operator gives ids elsewhere). The
    jobs are listed from the API server, not kopf's cache, under a lock: an id is
    chosen only once the last one chosen is recorded."""
    with _overlay_lock:
        if WATCH_NAMESPACES:   # only these: the operator may read no other
            jobs = [j for ns in WATCH_NAMESPACES for j in api.list_namespaced_custom_object(
                crd.GROUP, crd.VERSION, ns, crd.PLURAL)["items"]]
        else:
            jobs = api.list_cluster_custom_object(crd.GROUP, crd.VERSION, crd.PLURAL)["items"]
        held = overlay_ids.taken(
            j for j in jobs if (j["metadata"]["namespace"], j["metadata"]["name"])
            != (namespace, name))
        api.patch_namespaced_custom_object_status(
            crd.GROUP, crd.VERSION, namespace, crd.PLURAL, name,
            {"status": {**fields, overlay_ids.STATUS_FIELD: overlay_ids.choose(held)}})


def _create_background(core: Any, job: spec.TrainingJob, namespace: str,
                       owner: dict[str, Any], patch: Any,
                       where: placement.Placement) -> Any:
    """spec.backgroundLoad: its config map and background pods (tailcut.k8s.manifests.background),
    and status.background saying where Locust's statistics end up. Returns the plan
    (None without a backgroundLoad) for the sidecars of training pods."""
    bg = background.plan(job)
    if bg is None:
        return None
    uid = owner["uid"]
    _create(core.create_namespaced_config_map, core.read_namespaced_config_map, namespace,
            background.config_map(job, bg, owner), uid)
    for pod in background.pods(job, bg, owner, WORKER_IMAGE, where=where,
                               container_resources=WORKER_RESOURCES):
        _create(core.create_namespaced_pod, _read_pod(core), namespace, pod, uid)
    patch.status["background"] = background.status(job, bg, namespace)
    return bg


def _stop_pods(namespace: str, pods: list[dict[str, Any]], logger: Logger,
               failed: bool) -> None:
    """The job ended: end its background pods now rather than at their deadline, and,
    if it failed, its training pods still running or waiting (for peers that will not
    come, or for links a node that cannot carry them will never wire). A pod's
    activeDeadlineSeconds may only be lowered; at 1 the kubelet stops it at once
    (SIGTERM: Locust writes its CSVs) and keeps its logs, which deleting would not."""
    core = kubernetes.client.CoreV1Api()
    for pod in pods:
        meta = pod["metadata"]
        role = (meta.get("labels") or {}).get(resources.LABEL_ROLE)
        if (role not in background.ROLES and not failed) or \
                (pod.get("status") or {}).get("phase") in TERMINAL:
            continue
        try:
            core.patch_namespaced_pod(meta["name"], namespace,
                                      {"spec": {"activeDeadlineSeconds": 1}})
        except kubernetes.client.ApiException as err:
            if err.status != 404:
                logger.warning(f"stopping {namespace}/{meta['name']}: "
                               f"{err.status} {err.reason}")


def _record_pods(job: spec.TrainingJob, api_pods: list[dict[str, Any]], old: dict[str, Any],
                 patch: Any, generation: Optional[int]) -> None:
    """Phase, counts and the agents' records from the job's own pods (_owned_pods)."""
    phase, counts, reason, message = resources.status_from_pods(job, api_pods)
    _set_status(patch, old, phase, reason, message, generation)
    target = patch.status if hasattr(patch, "status") else patch
    target["replicaStatuses"] = counts
    network = resources.network_from_pods(api_pods)
    if network:   # what the node agents applied on the job's links
        target["network"] = network
    drops = resources.queue_drops_from_pods(api_pods)
    if drops:     # what their full queues dropped, as the agents released the pods
        target["queueDrops"] = drops
    wiring = resources.wiring_errors_from_pods(api_pods)
    if wiring or old.get("wiringErrors"):   # what the agents could not wire, and why
        target["wiringErrors"] = {**{r: None for r in old.get("wiringErrors") or {}},
                                  **wiring}


def _set_status(patch: Any, old: dict[str, Any], phase: str, reason: str, message: str,
                generation: Optional[int], created: bool = True) -> None:
    """Phase, message and conditions; `created` False: the job's objects do not all
    exist (Created False, for the same reason)."""
    target = patch.status if hasattr(patch, "status") else patch
    target["phase"] = phase
    target["observedGeneration"] = generation
    target["message"] = status.capped(message)
    what = ("run started on the operator's host" if BACKEND == "local"
            else "pods, service and config map created") if created else None
    target["conditions"] = status.merge_conditions(
        old.get("conditions") or [],
        status.phase_conditions(phase, reason, message, what, generation))
    if phase == "Running" and not old.get("startTime"):
        target["startTime"] = status.now()
    if phase in TERMINAL:
        target["completionTime"] = status.now()


def _conditions_changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    def key(conds: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(c.get("type"), c.get("status"), c.get("reason")) for c in conds]
    return key(old.get("conditions") or []) != key(new.get("conditions") or [])


# --- local backend ---------------------------------------------------------------

def _start_local(job: spec.TrainingJob, namespace: str, old: dict[str, Any], patch: Any,
                 generation: Optional[int], logger: Logger) -> None:
    key = (namespace, job.name)
    with _lock:
        if key in _local_runs and _local_runs[key].poll() is None:
            return
        if old.get("phase") == "Running":
            # The operator restarted mid-run: the run died with it (PDEATHSIG), so
            # clear what it left and start again.
            subprocess.run([sys.executable, "-m", "tailcut.cli", "clean", job.name],
                           capture_output=True, timeout=60)
        out = RESULTS_DIR / f"{namespace}-{job.name}"
        if (out / "run.json").exists():   # an earlier attempt's: kept beside, not mixed in
            out.rename(out.with_name(f"{out.name}-{int(out.stat().st_mtime)}"))
        out.mkdir(parents=True, exist_ok=True)
        job_file = out / "trainingjob.yaml"
        job_file.write_text(yaml.safe_dump(job.model_dump(by_alias=True, mode="json")))
        proc = subprocess.Popen(
            [sys.executable, "-m", "tailcut.cli", "run", str(job_file), "--results-dir",
             str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=_die_with_parent)
        _local_runs[key] = proc
    _set_status(patch, old, "Running", "LocalRunStarted",
                f"running on this host; results in {out}", generation)
    patch.status["progress"] = f"0/{job.spec.training.epochs} epochs"
    patch.status["resultsDir"] = str(out.resolve())
    threading.Thread(target=_follow_local, args=(job, namespace, proc, out, generation, logger),
                     daemon=True).start()


def _follow_local(job: spec.TrainingJob, namespace: str, proc: subprocess.Popen[str],
                  out: Path, generation: Optional[int], logger: Logger) -> None:
    api = kubernetes.client.CustomObjectsApi()

    def post(fields: dict[str, Any]) -> None:
        try:
            api.patch_namespaced_custom_object_status(
                crd.GROUP, crd.VERSION, namespace, crd.PLURAL, job.name, {"status": fields})
        except kubernetes.client.ApiException as err:
            logger.warning(f"status of {namespace}/{job.name}: {err.status} {err.reason}")

    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-15:]
        match = _EPOCH.match(line.strip())
        if match:
            post({"epoch": int(match.group(1)),
                  "progress": f"{match.group(1)}/{match.group(2)} epochs"})
    code = proc.wait()
    with _lock:
        _local_runs.pop((namespace, job.name), None)
    try:
        metrics = json.loads((out / "metrics.json").read_text())
    except (OSError, json.JSONDecodeError):
        metrics = None
    fields: dict[str, Any] = {}
    try:  # merge with the conditions as they are, to keep their transition times
        current: dict[str, Any] = api.get_namespaced_custom_object(  # type: ignore[assignment]
            crd.GROUP, crd.VERSION, namespace, crd.PLURAL, job.name)
        old = current.get("status") or {}
    except kubernetes.client.ApiException:
        old = {}
    if metrics is not None and code in (errors.EXIT_FINISHED, errors.EXIT_TARGET_NOT_REACHED):
        target = job.spec.training.target_accuracy
        ok = code == errors.EXIT_FINISHED
        reason = "TrainingFinished" if ok else "TargetNotReached"
        message = (f"JCT {metrics['jct_s']:.1f} s, {metrics['epochs']} epochs, accuracy "
                   f"{metrics['final_accuracy']:.3f}" + ("" if ok else
                                                          f" < targetAccuracy {target}"))
        _set_status(fields, old, "Succeeded" if ok else "Failed", reason, message, generation)
        fields.update({"jctSeconds": round(metrics["jct_s"], 2),
                       "accuracy": round(metrics["final_accuracy"], 4),
                       "loss": round(metrics["final_loss"], 4),
                       "converged": bool(metrics["converged"]),
                       "progress": f"{metrics['epochs']}/{job.spec.training.epochs} epochs",
                       **resources.fidelity_status(metrics.get("fidelity"))})
    else:
        _set_status(fields, old, "Failed", "LocalRunFailed",
                    f"tailcut run exited with {code}: " + " | ".join(tail[-5:]), generation)
    post(fields)


def _die_with_parent() -> None:
    import ctypes
    import signal
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
