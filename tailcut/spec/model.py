"""The TrainingJob spec as typed, frozen models with defaults and validation.

Field names are snake_case in Python and camelCase in YAML (the custom resource's
shape); units live in the names (delay_ms, jitter_ms). Everything that can be checked
without looking at the machine is checked here, so inner code can trust its inputs.
"""

from typing import Annotated, Any, Final, Literal, Optional

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer,
                      ValidationInfo, WithJsonSchema, field_validator, model_validator)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import SkipJsonSchema

from tailcut.spec import background, sync_modes, tor_kinds, transport_kinds, units

API_VERSION: Final = "tailcut.dev/v1alpha1"
KIND: Final = "TrainingJob"
# tailcut's own transports: the CRD's enum. The spec takes any transport registered on
# this host (transport_kinds.names(): a researcher's own, under `tailcut run`).
TRANSPORTS = transport_kinds.BUILTIN_NAMES
SYNC_MODES = sync_modes.NAMES  # the CRD's enum, as Training.sync_mode's Literal
TORCH_MODEL = "torch"        # training.model naming a user's PyTorch factory (module)
ALLREDUCE_PORT = 29500       # worker-0's torch.distributed rendezvous (its default)
MAX_RACKS = 250              # rack r gets the subnet 10.<r+1>.0.0/24
MAX_PODS_PER_RACK = 250

Bandwidth = Annotated[
    int,
    BeforeValidator(units.parse_bandwidth),
    PlainSerializer(units.format_bandwidth, return_type=str),
    WithJsonSchema({"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?\s*[kKmMgGtT]?bit$",
                    "description": "bits per second, tc style: 100Mbit, 1Gbit"}),
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True,
                              alias_generator=to_camel, populate_by_name=True)


# A switch port's output buffer (docs/network.md#switch-buffers). A byte limit must
# hold one full-size Ethernet frame (1500 bytes of MTU + 14 of header, what a qdisc
# counts on a veth), or the queue drops every full-size packet.
MIN_BUFFER_BYTES: Final = 1514
MAX_BUFFER_PACKETS: Final = 1_000_000      # ~1.5 GB of full frames: far past any switch
MAX_BUFFER_BYTES: Final = 1_000_000_000
# The job's MTU (docs/network.md#mtu). IPv4 only: 576 is the datagram size every IPv4
# host must accept (RFC 791), so no lower MTU is realistic; 9000 is the jumbo frame
# datacenter fabrics run, and what the bounded-loss XDP counter is sized for.
DEFAULT_MTU: Final = 1500
MIN_MTU: Final = 576
MAX_MTU: Final = 9000


class Link(_Model):
    """One direction-symmetric link: both directions get the same shaping."""

    bandwidth: Bandwidth = Field(default=10**9, description="rate of each direction")
    loss: float = Field(default=0.0, ge=0.0, le=1.0,
                        description="fraction of packets dropped in each direction")
    delay_ms: float = Field(default=0.0, ge=0.0, le=10_000.0, description="one-way delay")
    jitter_ms: float = Field(default=0.0, ge=0.0, le=10_000.0,
                             description="delay variation; needs delay_ms > 0")
    buffer_packets: Optional[int] = Field(
        default=None, ge=1, le=MAX_BUFFER_PACKETS,
        description="output queue of each end of the link, in packets (tail drop, per "
                    "HTB class); unset: the kernel's default queue (txqueuelen, 1000 "
                    "packets)")
    buffer_bytes: Optional[int] = Field(
        default=None, ge=MIN_BUFFER_BYTES, le=MAX_BUFFER_BYTES,
        description="output queue of each end of the link, in bytes (tail drop, per HTB "
                    "class); at least one full frame, 1514 (mtu + 14 for a larger "
                    "network.mtu); give this or bufferPackets")

    @field_validator("buffer_packets", mode="before")
    @classmethod
    def _holds_a_packet(cls, value: object) -> object:
        if type(value) is int and value < 1:
            raise ValueError("must be at least 1 packet: a queue of none drops everything")
        return value

    @field_validator("buffer_bytes", mode="before")
    @classmethod
    def _holds_a_frame(cls, value: object) -> object:
        if type(value) is int and value < MIN_BUFFER_BYTES:
            raise ValueError(
                f"must be at least {MIN_BUFFER_BYTES} bytes, one full-size Ethernet frame "
                "(1500-byte MTU + 14-byte header): a smaller byte queue drops every "
                "full-size packet (to count packets, use bufferPackets)")
        return value

    @model_validator(mode="after")
    def _jitter_needs_delay(self) -> "Link":
        if self.jitter_ms > 0 and self.delay_ms == 0:
            raise ValueError(f"jitterMs: {self.jitter_ms} needs delayMs > 0 "
                             "(jitter varies a delay)")
        return self

    @model_validator(mode="after")
    def _one_buffer_unit(self) -> "Link":
        if self.buffer_packets is not None and self.buffer_bytes is not None:
            raise ValueError("bufferBytes: give bufferPackets or bufferBytes, not both (a "
                             "queue's limit counts packets or bytes; remove one)")
        return self


class Aggregator(_Model):
    """An MLfabric aggregator pod: sums its workers' updates before they reach the PS."""

    workers: list[int] = Field(min_length=1, description="indices of the workers it serves")


class Replicas(_Model):
    """How many of each role. Parameter servers split the flat parameter vector into
    equal contiguous ranges (one per PS); see docs/roles.md."""

    parameter_servers: int = Field(default=1, ge=1, le=64)
    workers: int = Field(default=2, ge=1, le=1000)
    ps_replica: bool = Field(
        default=False,
        description="run a PS replica that receives every update and takes over when "
                    "the PS dies (one parameter server only)")
    aggregators: list[Aggregator] = Field(
        default_factory=list, max_length=64,
        description="aggregator pods (MLfabric), each with the workers it serves")

    @model_validator(mode="after")
    def _roles_fit(self) -> "Replicas":
        if self.ps_replica and self.parameter_servers != 1:
            raise ValueError(f"psReplica: a replica needs parameterServers: 1, not "
                             f"{self.parameter_servers} (one replica per shard is not "
                             "supported)")
        served: dict[int, int] = {}
        for a, agg in enumerate(self.aggregators):
            for w in agg.workers:
                if not 0 <= w < self.workers:
                    raise ValueError(f"aggregators[{a}].workers: worker {w} does not exist; "
                                     f"workers are 0..{self.workers - 1}")
                if w in served:
                    raise ValueError(f"aggregators[{a}].workers: worker {w} is already "
                                     f"served by aggregators[{served[w]}]")
                served[w] = a
        return self


class Training(_Model):
    model: str = Field(default="mlp", description="a built-in model (tailcut models), or "
                       "torch: a PyTorch module given by module (docs/pytorch.md)")
    module: Optional[str] = Field(
        default=None,
        description="model torch: \"package.module:factory\" or \"path/to/file.py:factory\", "
                    "a function of the seed returning (nn.Module, loss, (x_train, y_train, "
                    "x_test, y_test)); docs/pytorch.md")
    batch_size: int = Field(default=32, ge=1, le=65536, description="examples per worker per iteration")
    learning_rate: float = Field(default=0.1, gt=0.0, le=100.0)
    epochs: int = Field(default=20, ge=1, le=100_000, description="maximum epochs")
    iterations: Optional[int] = Field(default=None, ge=1, description="maximum iterations")
    target_accuracy: Optional[float] = Field(
        default=None, gt=0.0, le=1.0, description="stop once test accuracy reaches this")
    sync_mode: Literal["bsp", "async", "ssp", "allreduce"] = Field(
        default="bsp", description="bsp: barrier every iteration; async: apply each push "
                                   "at once; ssp: async within a staleness bound; "
                                   "allreduce: no PS, the workers all-reduce: PyTorch "
                                   "DDP with Gloo over tcp, tailcut's transpose all-reduce "
                                   "over bounded-loss or udp (a torch model; "
                                   "docs/pytorch.md)")
    staleness: int = Field(default=0, ge=0, le=1000,
                           description="ssp: iterations a worker may run ahead of the slowest")
    ordering: Literal["fifo", "stf"] = Field(
        default="fifo", description="which waiting update a PS takes first: fifo (arrival) "
                                    "or stf (shortest transfer first, MLfabric)")
    connection_window_us: int = Field(
        default=1000, ge=1, le=10**7,
        description="window over which a PS counts concurrent connections (IMC'20: 1000)")
    aggregation: Literal["mean", "unbiased"] = Field(
        default="mean",
        description="how a bsp PS combines the gradient values that arrived over a lossy "
                    "transport: mean (per coordinate, over the workers whose value arrived) "
                    "or unbiased (sum / (workers x share delivered), inverse-probability "
                    "weighting, unbiased for the all-worker mean under random loss; "
                    "docs/bounded-loss.md)")
    seed: int = 0
    timeout_s: float = Field(default=600.0, gt=0.0, description="wall-time limit of the run")

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value != TORCH_MODEL and value not in known_models() + torch_models():
            raise ValueError(f"unknown model {value!r}; known: "
                             f"{', '.join(known_models() + torch_models())}, "
                             f"{TORCH_MODEL} (with module)")
        return value

    @field_validator("module")
    @classmethod
    def _module_loads(cls, value: Optional[str], info: ValidationInfo) -> Optional[str]:
        """Import the factory now, so a typo or a broken module is refused before
        anything is built. A relative file path is made absolute (the roles run
        elsewhere). Where the caller imports no module (spec.from_dict's
        import_modules=False), only its form is checked."""
        if value is None:
            return value
        from tailcut.ml import torchmodel
        if not (info.context or {}).get("import_modules", True):
            try:
                torchmodel.split_ref(value)
            except torchmodel.ModuleError as err:
                raise ValueError(f"{value!r} {err}") from None
            return value
        where, sep, name = value.rpartition(":")
        if sep and where.endswith(".py"):
            import os
            value = f"{os.path.abspath(where)}:{name}"
        try:
            torchmodel.load_factory(value)
        except (torchmodel.TorchMissing, torchmodel.ModuleError) as err:
            raise ValueError(str(err)) from None
        return value

    @model_validator(mode="after")
    def _module_with_torch(self) -> "Training":
        if self.model == TORCH_MODEL and self.module is None:
            raise ValueError('module: model torch needs module, e.g. module: '
                             '"mypkg.models:build" (docs/pytorch.md)')
        if self.module is not None and self.model != TORCH_MODEL:
            raise ValueError(f"module: only model torch takes a module (model is "
                             f"{self.model!r}); set model: torch or remove module")
        if self.mode.torch_only and self.model not in torch_models() + (TORCH_MODEL,):
            raise ValueError(f"syncMode: {self.sync_mode} trains PyTorch models, so it needs a torch "
                             f"model ({', '.join(torch_models())} or torch with module), "
                             f"not {self.model!r}")
        return self

    @property
    def mode(self) -> sync_modes.SyncMode:
        """What sync_mode is (tailcut.spec.sync_modes): has a PS, takes staleness, ..."""
        return sync_modes.get(self.sync_mode)

    @property
    def model_ref(self) -> str:
        """The model as tailcut.ml.models names it: "torch:<module>" for a user's."""
        return f"torch:{self.module}" if self.model == TORCH_MODEL else self.model


def known_models() -> tuple[str, ...]:
    """The models a job may name: tailcut.ml.models' registry, the one source of truth.

    Imported when called, not at the top: the registry imports numpy, and a spec
    loaded in a role process must not load numpy before the role limits its threads.
    """
    from tailcut.ml import models
    return tuple(models.names())


def torch_models() -> tuple[str, ...]:
    """The built-in models that are PyTorch modules."""
    from tailcut.ml import models
    return models.TORCH_MODELS


class Transport(_Model):
    type: str = "tcp"
    p: Optional[float] = Field(
        default=None, gt=0.0, le=1.0,
        description="bounded-loss: fraction of every message that must arrive; "
                    "app-drop: fraction the sender keeps")
    rate_mbit: Optional[float] = Field(
        default=None, gt=0.0, le=1_000_000.0,
        description="udp/bounded-loss: the most any sender sends at; unset: its access "
                    "link's rate. Either way each receiver grants the messages converging "
                    "on it equal shares of its link (docs/bounded-loss.md)")
    xdp_mode: Literal["generic", "native"] = Field(
        default="generic",
        description="bounded-loss: XDP mode of the receive counter (native costs TCP "
                    "throughput on a veth)")
    receive_path: Literal["socket", "kernel"] = Field(
        default="socket",
        description="bounded-loss: how a receiver takes its datagrams. socket: its "
                    "receive thread reads every one, the XDP counter saying when p is "
                    "reached; kernel: a tc program at its interface's ingress places each "
                    "in a buffer the role maps, and the thread wakes when a message "
                    "reaches p, not for its datagrams (docs/bounded-loss.md, 'The kernel "
                    "receive path')")
    min_p: Optional[float] = Field(
        default=None, gt=0.0, le=1.0,
        description="bounded-loss: early close (adaptive completion, as LTP's Early Close "
                    "and OptiReduce's adaptive timeout). A message below p whose pass is "
                    "over (its last packet read, then nothing more from it for 16 of its "
                    "recent inter-packet gaps, 0.2-2 ms; or its END drained) is handed "
                    "over with what arrived if that is at least minP, instead of being "
                    "NACKed and retransmitted up to p. Unset: p, the floor it never goes "
                    "under (docs/bounded-loss.md)")
    tcp_congestion_control: Optional[str] = Field(
        default=None, pattern=r"^[a-z][a-z0-9_]{0,15}$",
        description="tcp/app-drop: the TCP congestion control of the job's connections "
                    "(TCP_CONGESTION: cubic, reno, bbr, dctcp, ... as the kernel has them, "
                    "net.ipv4.tcp_available_congestion_control). Unset: the kernel's "
                    "default, which tcp-<pod>.json records (BBR on the development VMs; "
                    "cubic on most Linux hosts)")

    @field_validator("type")
    @classmethod
    def _known_transport(cls, value: str) -> str:
        transport_kinds.get(value)  # ValueError naming the known ones
        return value

    @model_validator(mode="after")
    def _options_where_they_apply(self) -> "Transport":
        kind = transport_kinds.get(self.type)
        if kind.takes_p and self.p is None:
            raise ValueError(f"p: {self.type} needs p, the fraction of every message to "
                             "deliver, in (0, 1], e.g. p: 0.9")
        if not kind.takes_p and self.p is not None:
            raise ValueError(f"p: only {' and '.join(transport_kinds.with_trait('takes_p'))} "
                             f"take p; "
                             f"{self.type} delivers what it delivers")
        if self.min_p is not None and not kind.xdp_counter:
            raise ValueError(f"minP: only {' and '.join(transport_kinds.with_trait('xdp_counter'))}"
                             f" closes a message early; {self.type} does not take minP")
        if self.receive_path != "socket" and not kind.xdp_counter:
            raise ValueError(f"receivePath: only "
                             f"{' and '.join(transport_kinds.with_trait('xdp_counter'))} "
                             f"receive in the kernel; {self.type} takes its datagrams "
                             "through its socket")
        if self.receive_path == "kernel" and self.min_p is not None:
            raise ValueError("minP: early close watches each packet's arrival in the "
                             "receiving role, which the kernel receive path does not see; "
                             "use receivePath: socket with minP")
        if self.min_p is not None and self.p is not None and self.min_p > self.p:
            raise ValueError(f"minP: {self.min_p} is above p = {self.p}; minP is the "
                             "floor a message may close at once its packets stop coming, "
                             "p where it completes at once, so minP <= p")
        if self.tcp_congestion_control is not None and not kind.kernel_tcp:
            raise ValueError(f"tcpCongestionControl: only "
                             f"{' and '.join(transport_kinds.with_trait('kernel_tcp'))} carry "
                             f"the vectors over TCP; {self.type} does not take it")
        if self.rate_mbit is not None and not kind.datagrams:
            paced = " and ".join(transport_kinds.with_trait("datagrams"))
            raise ValueError(f"rateMbit: {self.type} is paced by "
                             f"{'TCP' if kind.kernel_tcp else 'itself'}; only {paced} take "
                             "a rate")
        return self


_Name = Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$",
                             description="lower-case letters, digits and '-'")]


class Rack(_Model):
    name: _Name


MAX_HOT_PARAMETERS = 65_520   # the ToR store's maps (ebpf/tor.h: 182 slots of 360)
MAX_HOT_WORKERS = 32          # one bit each in a slot's claim word


class HotParameters(_Model):
    """Which parameters the ToR holds: the top_k most often updated (measured on the
    job's own data before training), or these flat indices of the model's vector."""

    top_k: Optional[int] = Field(default=None, ge=1, le=MAX_HOT_PARAMETERS,
                                 description="the k parameters updated most often")
    indices: Optional[list[int]] = Field(default=None, min_length=1,
                                         max_length=MAX_HOT_PARAMETERS,
                                         description="flat indices into the model's vector")

    @model_validator(mode="after")
    def _one_way(self) -> "HotParameters":
        if (self.top_k is None) == (self.indices is None):
            raise ValueError("give exactly one of topK (the k most often "
                             "updated) or indices")
        if self.indices is not None:
            negative = [i for i in self.indices if i < 0]
            if negative:
                raise ValueError(f"indices: {negative[0]} is negative")
            seen: set[int] = set()
            for i in self.indices:
                if i in seen:
                    raise ValueError(f"indices: {i} appears twice")
                seen.add(i)
        return self


class InNetwork(_Model):
    """Work the ToRs do for the job, in BPF (docs/in-network.md), any of: the PS's ToR
    holds hot parameters, every rack's ToR sums its workers' gradients, every rack's
    ToR copies the PS's parameters to its workers."""

    hot_parameters: Optional[HotParameters] = Field(
        default=None,
        description="parameters the PS's ToR keeps, serves to pulls and updates with pushes")
    aggregate: bool = Field(
        default=False,
        description="each rack's ToR sums its workers' gradients and sends the PS one sum")
    multicast: bool = Field(
        default=False,
        description="the PS sends each rack one copy of the parameters and the rack's ToR "
                    "copies it to the rack's workers (a lost copy is repaired by the PS)")
    # ToR kinds installed packages register (tailcut.spec.tor_kinds), by name, with their
    # options (JSON, read by the kind's plan). Not in the CRD: like a transport of your
    # own, a kind of your own runs under `tailcut run` (docs/in-network.md).
    kinds: SkipJsonSchema[dict[str, dict[str, Any]]] = Field(default_factory=dict)

    @field_validator("kinds")
    @classmethod
    def _registered(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name in value:
            if name in tor_kinds.BUILTIN_NAMES:
                raise ValueError(f"kinds: {name!r} is one of tailcut's own ToR kinds; ask "
                                 "for it by hotParameters, aggregate or multicast")
            if name not in tor_kinds.names():
                raise ValueError(f"kinds: unknown ToR kind {name!r}; registered: "
                                 f"{', '.join(tor_kinds.plugin_names()) or 'none'}")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> "InNetwork":
        if (self.hot_parameters is None and not self.aggregate and not self.multicast
                and not self.kinds):
            raise ValueError("give hotParameters, aggregate: true or multicast: true (or "
                             "a ToR kind of your own under kinds)")
        return self


class Network(_Model):
    racks: list[Rack] = Field(default_factory=lambda: [Rack(name="rack-0")], min_length=1,
                              max_length=MAX_RACKS)
    placement: dict[str, str] = Field(
        default_factory=dict,
        description="pod name -> rack name; pods not listed fill the racks in order")
    access_link: Link = Field(default_factory=Link, description="each pod to its rack")
    uplink: Link = Field(default_factory=Link, description="each rack to the spine")
    in_network: Optional[InNetwork] = Field(
        default=None, description="work the ToRs do in BPF: hot parameters, aggregation, "
                                  "multicast of the parameters")
    mtu: int = Field(
        default=DEFAULT_MTU, ge=MIN_MTU, le=MAX_MTU,
        description="IP MTU in bytes of every link of the job (the pods' interfaces, the "
                    "rack ports, the uplinks and the ToR bridges); the datagram transports "
                    "(udp, bounded-loss) size their packets by it. 576 (the least every "
                    "IPv4 host accepts) to 9000 (jumbo frames); 1500 is Ethernet's")

    @field_validator("racks")
    @classmethod
    def _unique_racks(cls, racks: list[Rack]) -> list[Rack]:
        names = [r.name for r in racks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"rack names must be unique; repeated: {', '.join(dupes)}")
        return racks

    @model_validator(mode="after")
    def _buffers_hold_a_frame(self) -> "Network":
        # Link's own floor is a 1500-byte MTU's frame; a larger MTU raises it.
        frame = self.mtu + 14
        for name, link in (("accessLink", self.access_link), ("uplink", self.uplink)):
            if link.buffer_bytes is not None and link.buffer_bytes < frame:
                raise ValueError(
                    f"{name}.bufferBytes: {link.buffer_bytes} is less than one full-size "
                    f"frame at mtu {self.mtu} ({frame} bytes): the queue would drop every "
                    f"full-size packet; give at least {frame} or lower mtu")
        return self


SCHEDULING_POLICIES = ("fair", "coflow", "cadentflow")
MAX_PRIORITY_LEVELS = 8   # HTB classes 1:20..1:27 per pod (tailcut.net.shaping)


class FlowTag(_Model):
    """CadentFlow tags of the flows that carry one tensor (a layer of the model)."""

    layer: str = Field(description="tensor name as the model lists it (e.g. 'W1'), or '*'")
    direction: Literal["pull", "push", "both"] = Field(
        default="both", description="pull: PS -> worker (parameters); push: gradients")
    priority: Optional[int] = Field(default=None, ge=0,
                                    description="0 is the most urgent level")
    deadline_ms: Optional[float] = Field(
        default=None, ge=0.0, description="from the start of the pass the flow belongs to")
    weight: Optional[float] = Field(
        default=None, gt=0.0, le=1000.0,
        description="share of the link among flows of equal priority (class rate)")


class Scheduling(_Model):
    """How the network treats the job's flows: the comparison switch of CadentFlow."""

    policy: str = Field(default="fair",
                        description="fair (TCP max-min), coflow (Varys MADD) or cadentflow")
    objective: Literal["minCompletionTime", "minMaxDelay"] = Field(
        default="minCompletionTime",
        description="minCompletionTime: finish the last flow first subject to priorities; "
                    "minMaxDelay: minimise the worst delay past the deadlines")
    derive_tags: bool = Field(
        default=True, description="derive tags from the model: forward pass earlier layers "
        "first, backward by gradient readiness, deadlines from measured compute time")
    priority_levels: int = Field(default=4, ge=1, le=MAX_PRIORITY_LEVELS,
                                 description="priority classes per pod")
    flows: list[FlowTag] = Field(default_factory=list,
                                 description="hand-written tags; override derived ones")

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        if value not in SCHEDULING_POLICIES:
            raise ValueError(f"unknown scheduling policy {value!r}; choose one of "
                             f"{', '.join(SCHEDULING_POLICIES)}")
        return value

    @model_validator(mode="after")
    def _tags_fit(self) -> "Scheduling":
        if self.flows and self.policy != "cadentflow":
            raise ValueError(f"flows: per-flow tags need policy cadentflow (policy is "
                             f"{self.policy!r}); remove them or set policy: cadentflow")
        for i, tag in enumerate(self.flows):
            if tag.priority is not None and tag.priority >= self.priority_levels:
                raise ValueError(f"flows[{i}].priority: {tag.priority} is not a level of "
                                 f"this job; priorityLevels={self.priority_levels} allows "
                                 f"0..{self.priority_levels - 1}")
            if tag.deadline_ms is not None and self.objective != "minMaxDelay":
                raise ValueError(f"flows[{i}].deadlineMs: deadlines need objective "
                                 "minMaxDelay (the objective is minCompletionTime)")
            if tag.priority is None and tag.deadline_ms is None and tag.weight is None:
                raise ValueError(f"flows[{i}]: a tag needs at least one of priority, "
                                 "deadlineMs, weight")
        return self


class Metadata(BaseModel):
    """Kubernetes object metadata: only the name matters; the rest is kept as is."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$",
                      description="a DNS label of at most 40 characters")


class JobSpec(_Model):
    replicas: Replicas = Field(default_factory=Replicas)
    training: Training = Field(default_factory=Training)
    network: Network = Field(default_factory=Network)
    transport: Transport = Field(default_factory=Transport)
    background_load: Optional[background.BackgroundLoad] = Field(
        default=None, description="other applications' traffic on the job's links (Locust)")
    scheduling: Scheduling = Field(default_factory=Scheduling)

    def pod_names(self) -> list[str]:
        """Pods in creation order: parameter servers first, then workers, then the
        replica and aggregators (appended so plain jobs place pods as before).
        syncMode allreduce has workers only: they all-reduce among themselves."""
        if not self.training.mode.has_ps:
            return [f"worker-{i}" for i in range(self.replicas.workers)]
        return ([f"ps-{i}" for i in range(self.replicas.parameter_servers)]
                + [f"worker-{i}" for i in range(self.replicas.workers)]
                + (["replica-0"] if self.replicas.ps_replica else [])
                + [f"aggregator-{i}" for i in range(len(self.replicas.aggregators))])

    @model_validator(mode="after")
    def _sync_fits_roles(self) -> "JobSpec":
        t, mode = self.training, self.training.mode
        if t.staleness and not mode.takes_staleness:
            raise ValueError(f"training.staleness: {t.staleness} applies only to "
                             f"syncMode: {sync_modes.names_with('takes_staleness')}, "
                             f"not {t.sync_mode}")
        combining = sync_modes.names_with("combines_iteration")
        if t.aggregation != "mean" and not mode.combines_iteration:
            raise ValueError(f"training.aggregation: {t.aggregation} combines a {combining} "
                             f"iteration's pushes, so it needs syncMode: {combining}, "
                             f"not {t.sync_mode}")
        if not mode.has_ps:
            self._allreduce_fits()
        if self.replicas.aggregators and not mode.combines_iteration:
            raise ValueError(f"training.syncMode: aggregators sum one iteration's updates, "
                             f"so they need {combining}, not {t.sync_mode}")
        return self

    def _allreduce_fits(self) -> None:
        """DDP with Gloo (tcp) or the transpose all-reduce (tailcut.training.transpose):
        the workers and their connections, nothing of the PS's."""
        r = self.replicas
        for wrong, why in (
                (r.parameter_servers != 1, "replicas.parameterServers: allreduce has no "
                 "parameter server; leave it at 1 (the default)"),
                (r.ps_replica, "replicas.psReplica: allreduce has no PS to replicate"),
                (bool(r.aggregators), "replicas.aggregators: the all-reduce sums the "
                 "gradients itself; remove the aggregators"),
                (r.workers < 2, "replicas.workers: allreduce needs at least 2 workers"),
                (not transport_kinds.get(self.transport.type).allreduce,
                 f"transport.type: allreduce runs Gloo over tcp, or tailcut's transpose "
                 f"all-reduce over bounded-loss or udp, not {self.transport.type}"),
                (self.training.aggregation != "mean", "training.aggregation: the "
                 "all-reduce averages what arrived; leave it at mean"),
                (self.network.in_network is not None, "network.inNetwork: the ToR works "
                 "with a PS; remove it for allreduce"),
                (self.scheduling.policy != "fair", f"scheduling.policy: "
                 f"{self.scheduling.policy} tags a PS's pulls and pushes; allreduce "
                 "takes fair")):
            if wrong:
                raise ValueError(why)

    @model_validator(mode="after")
    def _in_network_fits(self) -> "JobSpec":
        if self.network.in_network is None:
            return self
        where = "network.inNetwork"
        r, t = self.replicas, self.training
        for wrong, why in (
                (t.sync_mode != "bsp", f"training.syncMode is {t.sync_mode}: the ToR folds "
                 "or sums an iteration's pushes once every worker's is in, so it needs bsp"),
                (r.parameter_servers != 1, f"replicas.parameterServers is "
                 f"{r.parameter_servers}: the ToR works for one PS"),
                (r.ps_replica, "replicas.psReplica: a replica would not see the ToR's "
                 "parameters or sums"),
                (bool(r.aggregators), "replicas.aggregators: pushes through an aggregator "
                 "process would pass the ToR by"),
                (r.workers > MAX_HOT_WORKERS, f"replicas.workers is {r.workers}: the ToR "
                 f"tracks at most {MAX_HOT_WORKERS}"),
                (self.transport.type != "tcp", f"transport.type is {self.transport.type}: "
                 "pulls go over tcp (the ToR's share is its own datagrams)"),
                (self.scheduling.policy != "fair", f"scheduling.policy is "
                 f"{self.scheduling.policy}: it cuts and tags the whole vector")):
            if wrong:
                raise ValueError(f"{where}: not with {why}")
        return self

    @model_validator(mode="after")
    def _placement_names_exist(self) -> "JobSpec":
        pods = set(self.pod_names())
        racks = [r.name for r in self.network.racks]
        for pod, rack in self.network.placement.items():
            if pod not in pods:
                raise ValueError(f"network.placement.{pod}: pod {pod!r} does not exist; this job's "
                                 f"pods are {', '.join(self.pod_names())}")
            if rack not in racks:
                raise ValueError(f"network.placement.{pod}: rack {rack!r} does not exist; "
                                 f"racks are {', '.join(racks)}")
        for rack, count in self.rack_sizes().items():
            if count > MAX_PODS_PER_RACK:
                raise ValueError(f"network: rack {rack!r} holds {count} pods; "
                                 f"at most {MAX_PODS_PER_RACK}")
        return self

    @model_validator(mode="after")
    def _background_load_names_exist(self) -> "JobSpec":
        if self.background_load is not None:
            background.check_names(self.background_load,
                                   [r.name for r in self.network.racks], self.rack_of())
        return self

    def rack_of(self) -> dict[str, str]:
        """Pod name -> rack name. Pods without a placement fill the racks in order,
        in equal contiguous chunks (ps-0 and the first workers share rack 0)."""
        racks = [r.name for r in self.network.racks]
        unplaced = [p for p in self.pod_names() if p not in self.network.placement]
        chunk = -(-len(unplaced) // len(racks)) if unplaced else 1
        result = {p: racks[i // chunk] for i, p in enumerate(unplaced)}
        result.update(self.network.placement)
        return {p: result[p] for p in self.pod_names()}

    def rack_sizes(self) -> dict[str, int]:
        sizes = {r.name: 0 for r in self.network.racks}
        for rack in self.rack_of().values():
            sizes[rack] += 1
        return sizes


class TrainingJob(_Model):
    api_version: Literal["tailcut.dev/v1alpha1"] = API_VERSION
    kind: Literal["TrainingJob"] = KIND
    metadata: Metadata
    spec: JobSpec = Field(default_factory=JobSpec)

    @property
    def name(self) -> str:
        return self.metadata.name
