"""One plan, two executors: what a validated TrainingJob asks of whoever runs it.

`tailcut run` (tailcut.runtime.local) and the Kubernetes path (the operator and the pod
entrypoint, workers/entrypoint.py) read a job through this module; nothing else turns
the spec into role configurations. It gives

- the topology (tailcut.net.topology.plan, the same for both),
- every role's configuration: transport options, CadentFlow tags, where each of
  its peers (PS shards, the replica, aggregators) listens, and the sections of the
  ToR's programs (`in_network`: addresses, racks, the hot set resolved once),
- what an executor cannot build, each refusal naming its field (`refusals`):
  `tailcut validate --executor`, `tailcut run` and the operator all ask it; the
  local executor's include what this machine's kernel lacks (a delay or jitter
  without netem), found by tailcut.features' probe, which a caller may replace,
- what runs but is most likely not what was meant (`cautions`: a link that drops
  every packet, a rack no pod is placed in).

A role reaches its peers by their addresses in the topology on both executors: the
local runtime gives each pod namespace its address on eth0, the Kubernetes node agent
gives each pod the same address on its second interface, tc0 (tailcut.k8s.agent), so
a role's configuration is the same wherever it runs.
"""

import functools
import os
import platform
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional, Protocol

from tailcut.background import plan as bgplan
from tailcut.errors import SpecError
from tailcut.net import shaping, topology
from tailcut.net.topology import Pod
from tailcut.scheduling import flowreport, runnable
from tailcut.spec import transport_kinds
from tailcut.spec.model import ALLREDUCE_PORT, Link, TrainingJob
from tailcut import innetplan
from tailcut.ml import models, torchmodel
from tailcut.training.config import RoleConfig

PS_PORT = 7000   # every listening role (PS shards, replica, aggregators) uses it
Executor = Literal["local", "kubernetes"]
EXECUTORS: tuple[Executor, ...] = ("local", "kubernetes")

# (pod it is seen from, pod named) -> the host the first uses to reach the second.
Hosts = Callable[[str, str], str]


class Probed(Protocol):
    """What the plan reads of a kernel feature probe (tailcut.features.Feature)."""

    @property
    def available(self) -> bool: ...
    @property
    def probed(self) -> bool: ...   # False: not tried, so `available` is unknown
    @property
    def detail(self) -> str: ...


# Probes this machine's kernel for netem: the local executor passes features.netem
# (the plan imports no probe: probing needs netlink and root); tests pass their own.
# None: not probed.
NetemProbe = Optional[Callable[[], Probed]]


def hosts(topo: topology.Topology) -> Hosts:
    """Every pod by its address on the job's links (a role binds its own: the
    datagram transports find their interface by it)."""
    return lambda me, pod: topo.pod(pod).ip


@dataclass(frozen=True)
class Refusal:
    field: str     # spec path, e.g. spec.transport.type
    message: str   # the whole sentence, starting with the field and its value

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Caution:
    """Something `job` asks for that runs but is most likely not what was meant."""

    field: str
    message: str

    def __str__(self) -> str:
        return self.message


def refusals(job: TrainingJob, executor: Executor,
             netem: NetemProbe = None) -> list[Refusal]:
    """What `executor` cannot build of `job`, each naming its field; [] if it runs.
    `netem` tells whether this machine's kernel has netem (asked only by the local
    executor, and only when a link sets a delay or jitter; without it, the build
    refuses what netem would be needed for)."""
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; one of {', '.join(EXECUTORS)}")
    found = (_kubernetes_refusals(job) if executor == "kubernetes"
             else _local_refusals(job, netem))
    if found:
        return found   # the checks below build the model
    # The same everywhere: cadentflow or coflow over what cannot carry them, a tag
    # naming a tensor the model lacks (resolving builds the model), a background rate
    # Locust cannot drive.
    for field, checked in (
            ("spec.scheduling.policy", lambda: runnable.check_runnable(job.spec.scheduling,
                                                                       job)),
            ("spec.scheduling.flows", lambda: role_flows(job)),
            ("spec.backgroundLoad", lambda: bgplan.plan(job, topology.plan(job))),
            ("spec.network.inNetwork", lambda: _check_in_network(job))):
        try:
            checked()
        except SpecError as err:
            found.append(Refusal(field, str(err)))
            break   # the later checks assume the earlier passed
        except torchmodel.TorchMissing as err:   # the operator's Python, without torch
            found.append(Refusal(field, f"{field}: resolving it builds the torch model "
                                        f"{job.spec.training.model}: {err}"))
            break
    return found


def _links(job: TrainingJob) -> list[tuple[str, Link]]:
    network = job.spec.network
    return [("spec.network.accessLink", network.access_link),
            ("spec.network.uplink", network.uplink)]


def _delays(job: TrainingJob) -> list[tuple[str, float]]:
    """(field, value) of every delay and jitter the job's links set."""
    return [(f"{name}.{key}", value) for name, link in _links(job)
            for key, value in (("delayMs", link.delay_ms), ("jitterMs", link.jitter_ms))
            if value > 0]


def _local_refusals(job: TrainingJob, netem: NetemProbe) -> list[Refusal]:
    """A delay or jitter needs netem in this machine's kernel, which builds the links
    (tailcut.net.shaping refuses it too, but only once `tailcut run` is building).
    A torch model needs torch in this Python, where the roles run. (On Kubernetes
    the worker image must carry it, which the operator cannot see from here; a
    `module` is imported by the spec itself, so it needed torch already.)"""
    delays = _delays(job)
    if delays and netem is not None:
        found = netem()
        if found.probed and not found.available:
            field, value = delays[0]
            return [Refusal(field, f"{field}={value:g}: this kernel (Linux "
                                   f"{platform.release()}) has no netem qdisc "
                                   f"({found.detail}), so delay and jitter cannot be "
                                   "emulated; set it to 0, or run on a kernel with netem "
                                   "(Debian 12's has it as a module; `tailcut doctor` "
                                   "shows what this one has)")]
    t = job.spec.training
    if not models.is_torch(t.model_ref):
        return []
    try:
        torchmodel.require()
    except torchmodel.TorchMissing as err:
        return [Refusal("spec.training.model",
                        f"spec.training.model: {t.model} needs PyTorch here, for its roles: "
                        f"{err}")]
    return []


def check(job: TrainingJob, executor: Executor, netem: NetemProbe = None) -> None:
    """Raise SpecError with the first refusal, before anything is built."""
    found = refusals(job, executor, netem)
    if found:
        raise SpecError(found[0].message)


# Link rate per core of this host above which a local run is likely to measure the
# host: on 2 cores the background quickstart was network-bound at 500 Mbit/s over tcp
# and bounded loss, and bounded loss already marginal at 1 Gbit/s (docs/fidelity.md).
DRIVABLE_BIT_PER_CORE = 500_000_000


def cautions(job: TrainingJob, executor: Executor = "local",
             netem: NetemProbe = None, cores: int | None = None) -> list[Caution]:
    """What runs but is most likely not what was meant, each naming its field: a link
    that drops every packet (no message gets through, so the job never finishes), a
    rack with no pod (built, and carries nothing), and, for the local executor, a
    delay whose netem could not be probed (the probe needs root) and links faster
    than this host's `cores` can likely drive."""
    found = [Caution(f"{name}.loss", f"{name}.loss=1: every packet is dropped in each "
                                     "direction, so no message gets through and the job "
                                     "cannot finish; loss is a fraction (0.01 is 1%)")
             for name, link in _links(job) if link.loss >= 1]
    for i, rack in enumerate(topology.plan(job).racks):
        if not rack.pods:
            found.append(Caution(
                f"spec.network.racks[{i}]",
                f"spec.network.racks[{i}] ({rack.name}): no pod is in this rack "
                f"(spec.network.placement puts them elsewhere, or the job has fewer pods "
                f"than racks); it is built and carries no traffic; remove it or place a "
                f"pod in it"))
    cores = cores or os.cpu_count() or 1
    for name, link in _links(job):
        if executor == "local" and link.bandwidth > DRIVABLE_BIT_PER_CORE * cores:
            found.append(Caution(
                f"{name}.bandwidth",
                f"{name}.bandwidth={link.bandwidth / 1e6:g}Mbit: faster than this host's "
                f"{cores} core(s) are likely to drive; the run may measure the host's CPU "
                f"rather than the network (its fidelity verdict says); `tailcut calibrate` "
                f"finds the highest rate at which it does not"))
            break
    delays = _delays(job)
    if executor == "local" and delays and (netem is None or not netem().probed):
        field, value = delays[0]
        found.append(Caution(field, f"{field}={value:g} needs netem, and whether this "
                                    f"kernel (Linux {platform.release()}) has it was not "
                                    "probed (the probe needs root): `tailcut run` refuses "
                                    "it where netem is missing; `sudo tailcut doctor` "
                                    "tells"))
    return found


def _kubernetes_refusals(job: TrainingJob) -> list[Refusal]:
    """Everything runs in pods, and the node agent loads the ToR programs. What
    depends on the cluster is the operator's to say, naming the chart's value: whether
    it has a worker image with PyTorch (`needs_torch`, workers.torchImage) and whether
    the namespace lets bounded-loss pods attach XDP (`needs_xdp`, a namespace label).
    Of the job's own: planning a CadentFlow or coflow schedule, or a ToR program,
    builds the model, and the operator imports no tenant's module (a tenant's code
    runs in its own pods only). A ToR kind of the job's own (inNetwork.kinds) runs under
    `tailcut run` only: the CRD has no such field, and the node agent loads only
    tailcut's own kinds."""
    in_network = job.spec.network.in_network
    if in_network is not None and in_network.kinds:
        field = "spec.network.inNetwork.kinds"
        return [Refusal(field, f"{field}: {', '.join(sorted(in_network.kinds))} is a ToR kind "
                               "of your own, which runs under `tailcut run` only (the "
                               "cluster's CRD and node agent know tailcut's own kinds: "
                               "hotParameters, aggregate, multicast)")]
    module = job.spec.training.module
    if module is None:
        return []
    for field, builds_model in (
            ("spec.scheduling.policy", job.spec.scheduling.policy in ("cadentflow", "coflow")),
            ("spec.network.inNetwork", job.spec.network.in_network is not None)):
        if builds_model:
            return [Refusal(field, f"{field}: planning it on Kubernetes builds the model, and "
                                   f"the operator imports no tenant's module "
                                   f"(spec.training.module={module!r}): use a built-in "
                                   "model here, or run the job with `tailcut run`")]
    return []


def _check_in_network(job: TrainingJob) -> None:
    """What each ToR kind the job asks for must hold fits the model (building the
    model tells how many parameters it has): each kind checks its own."""
    if job.spec.network.in_network is None:
        return
    t = job.spec.training
    parameters = models.create(t.model_ref, models.dataset(t.model_ref, t.seed)).num_params
    for kind in innetplan.kinds():
        kind.check(job, parameters)


def leader(job: TrainingJob) -> str:
    """The pod whose events tell the job's progress and end: the PS's shard 0, or with
    syncMode allreduce (no PS) rank 0, worker-0."""
    return "ps-0" if job.spec.training.mode.has_ps else "worker-0"


def needs_torch(job: TrainingJob) -> bool:
    """Whether the job's roles run PyTorch (a torch model, or DDP/Gloo): on Kubernetes
    their pods need the worker image with PyTorch (the chart's workers.torchImage)."""
    t = job.spec.training
    return t.mode.torch_only or models.is_torch(t.model_ref)


def needs_xdp(job: TrainingJob) -> bool:
    """Whether the job's receivers attach the XDP counter (bounded-loss): their pods
    need the BPF, NET_ADMIN and PERFMON capabilities."""
    return transport_kinds.get(job.spec.transport.type).xdp_counter


def role_config(job: TrainingJob, pod_name: str, results_dir: str, hosts: Hosts,
                flows: dict[str, Any] | None = None,
                tor: innetplan.Sections | None = None) -> RoleConfig:
    """The configuration the role of `pod_name` runs with. `flows` overrides the
    CadentFlow tags and `tor` the ToR programs' sections (the operator resolves both
    once and hands them to the pods)."""
    sections = tor if tor is not None else in_network(job)
    pod = topology.plan(job).pod(pod_name)
    t = job.spec.training
    r = job.spec.replicas

    def endpoint(name: str) -> str:
        return f"{hosts(pod_name, name)}:{PS_PORT}"

    # What every role's configuration holds, whatever its sync mode.
    config = functools.partial(
        RoleConfig, job=job.name, role=pod.role, index=pod.index, num_workers=r.workers,
        model=t.model_ref, batch_size=t.batch_size, learning_rate=t.learning_rate,
        max_epochs=t.epochs, max_iterations=t.iterations,
        target_accuracy=t.target_accuracy, seed=t.seed, sync_mode=t.sync_mode,
        results_dir=results_dir, timeout_s=t.timeout_s)
    if not t.mode.has_ps and job.spec.transport.type == "tcp":
        # DDP over Gloo, no PS: the workers meet at worker-0
        return config(ps_host=hosts(pod_name, "worker-0"), ps_port=ALLREDUCE_PORT,
                      transport={"type": "tcp"})
    if not t.mode.has_ps:
        # The transpose all-reduce (training.transpose): rank i owns shard i and
        # listens at its own address, as a PS shard would.
        racks = [rack.name for rack in job.spec.network.racks]
        rack_of = job.spec.rack_of()
        return config(ps_host=hosts(pod_name, "worker-0"), ps_port=PS_PORT,
                      transport=transport_options(job, pod),
                      shard_endpoints=[endpoint(f"worker-{i}") for i in range(r.workers)],
                      rank_racks=[racks.index(rack_of[f"worker-{i}"])
                                  for i in range(r.workers)])

    return config(
        ps_host=hosts(pod_name, "ps-0"), ps_port=PS_PORT,
        transport=transport_options(job, pod),
        shard_endpoints=[endpoint(f"ps-{i}") for i in range(r.parameter_servers)],
        replica_endpoint=endpoint("replica-0") if r.ps_replica else None,
        aggregators=[{"endpoint": endpoint(f"aggregator-{a}"), "workers": list(agg.workers)}
                     for a, agg in enumerate(r.aggregators)],
        staleness=t.staleness, ordering=t.ordering, window_us=t.connection_window_us,
        aggregation=t.aggregation,
        flows=flows if flows is not None else role_flows(job),
        tor=dict(sections))


def transport_options(job: TrainingJob, pod: Pod) -> dict[str, Any]:
    """The role's transport options from the spec (transports.get takes them).

    Datagram transports pace each message at the rate its receiver grants (an equal
    share of the receiver's link among the messages converging on it) and at most at
    the sender's own link rate, read from its interface, or at rateMbit if the spec
    sets one (tailcut.transports.congestion)."""
    t = job.spec.transport
    kind = transport_kinds.get(t.type)
    options: dict[str, Any] = {"type": t.type}
    if kind.seeded:  # one stream of random numbers per pod
        options.update(seed=job.spec.training.seed + pod.index
                       + (0 if pod.role == "ps" else 1))
    if kind.takes_p:
        options.update(p=t.p)
    if kind.datagrams:
        # Packets as large as the job's links carry: one datagram per frame.
        options.update(job=job.name, mtu=job.spec.network.mtu,
                       rate_bit=None if t.rate_mbit is None else t.rate_mbit * 1e6,
                       # UDP GSO: a path that drops anywhere has its pods cut GSO
                       # messages at their own interface, after their shaper and
                       # before any dropper or switch queue (tailcut.net.build,
                       # shaping.wire_end); on a clean one they reach the receiver
                       # whole (docs/bounded-loss.md).
                       gso=True,
                       # The shallowest switch buffer on the path bounds a message's
                       # start credit, and with none a burst may be a whole GSO
                       # message (tailcut.transports.sender).
                       switch_buffer_bytes=shaping.smallest_buffer_bytes(
                           [job.spec.network.access_link, job.spec.network.uplink],
                           job.spec.network.mtu),
                       # Every pod's own end of its link is shaped at this rate
                       # (tailcut.net.shaping): no need to read it back from the kernel.
                       link_bit=job.spec.network.access_link.bandwidth)
    if kind.xdp_counter:
        options.update(xdp_mode=t.xdp_mode)
        if t.receive_path != "socket":
            options.update(receive_path=t.receive_path)
        if t.min_p is not None:  # early close below p (unset: p is the floor)
            options.update(min_p=t.min_p)
    if t.tcp_congestion_control is not None:
        options.update(congestion_control=t.tcp_congestion_control)
    return options


CACHED_SPECS = 64  # per cache: a long-lived operator sees many jobs


def _cached(cache: "OrderedDict[str, Any]", key: str, make: Callable[[], Any]) -> Any:
    """``cache[key]``, made by ``make`` on a miss; the least recently used entry goes
    when the cache is full (clearing it all made a job's next lookup rebuild its model)."""
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = cache[key] = make()
    if len(cache) > CACHED_SPECS:
        cache.popitem(last=False)
    return value


_flows_cache: "OrderedDict[str, dict[str, Any]]" = OrderedDict()


def role_flows(job: TrainingJob) -> dict[str, Any]:
    """The roles' `flows` section (CadentFlow levels per tensor and direction, coflow
    pacing). Cached per spec: resolving builds the model, so once per run rather than
    once per pod, and once per job in a long-lived operator. (The whole spec is the key:
    coflow's rates depend on the links and the number of workers too.)"""
    flows: dict[str, Any] = _cached(_flows_cache, job.spec.model_dump_json(),
                                    lambda: flowreport.role_flows(job))
    return flows


_tor_cache: "OrderedDict[str, innetplan.Sections]" = OrderedDict()


def in_network(job: TrainingJob) -> innetplan.Sections:
    """The sections of the job's enabled ToR programs (spec.network.inNetwork), by kind
    (tailcut.innetplan.KINDS): addresses, racks and workers, and what costs compute
    (the hot set) resolved, as JSON data. `tailcut run` and the operator call it once
    and hand the result to the roles and the ToR programs (the node agent reads it from
    the job's status); cached per spec, as role_flows."""
    resolved: innetplan.Sections = _cached(_tor_cache, job.spec.model_dump_json(),
                                           lambda: innetplan.sections(job, topology.plan(job)))
    return resolved
