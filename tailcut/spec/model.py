"""The TrainingJob spec as typed, frozen models with defaults and validation.

Field names are snake_case in Python and camelCase in YAML (the custom resource's
shape); units live in the names (delay_ms, jitter_ms). Everything that can be checked
without looking at the machine is checked here, so inner code can trust its inputs.
"""

from typing import Annotated, Literal, Optional

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer,
                      WithJsonSchema, field_validator, model_validator)
from pydantic.alias_generators import to_camel

from tailcut.spec import units

API_VERSION = "tailcut.dev/v1alpha1"
KIND = "TrainingJob"
TRANSPORTS = ("tcp",)        # udp, bounded-loss and app-drop arrive with the transport work
SYNC_MODES = ("bsp",)
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


class Link(_Model):
    """One direction-symmetric link: both directions get the same shaping."""

    bandwidth: Bandwidth = Field(default=10**9, description="rate of each direction")
    loss: float = Field(default=0.0, ge=0.0, le=1.0,
                        description="fraction of packets dropped in each direction")
    delay_ms: float = Field(default=0.0, ge=0.0, le=10_000.0, description="one-way delay")
    jitter_ms: float = Field(default=0.0, ge=0.0, le=10_000.0,
                             description="delay variation; needs delay_ms > 0")

    @model_validator(mode="after")
    def _jitter_needs_delay(self) -> "Link":
        if self.jitter_ms > 0 and self.delay_ms == 0:
            raise ValueError(f"jitterMs: {self.jitter_ms} needs delayMs > 0 "
                             "(jitter varies a delay)")
        return self


class Replicas(_Model):
    parameter_servers: int = Field(default=1, ge=1)
    workers: int = Field(default=2, ge=1, le=1000)

    @field_validator("parameter_servers")
    @classmethod
    def _one_ps_for_now(cls, value: int) -> int:
        if value != 1:
            raise ValueError(f"{value} parameter servers: only 1 is supported until "
                             "sharded parameter servers land; use 1")
        return value


class Training(_Model):
    model: str = "mlp"
    batch_size: int = Field(default=32, ge=1, le=65536, description="examples per worker per iteration")
    learning_rate: float = Field(default=0.1, gt=0.0, le=100.0)
    epochs: int = Field(default=20, ge=1, le=100_000, description="maximum epochs")
    iterations: Optional[int] = Field(default=None, ge=1, description="maximum iterations")
    target_accuracy: Optional[float] = Field(
        default=None, gt=0.0, le=1.0, description="stop once test accuracy reaches this")
    sync_mode: Literal["bsp"] = "bsp"
    seed: int = 0
    timeout_s: float = Field(default=600.0, gt=0.0, description="wall-time limit of the run")

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value not in known_models():
            raise ValueError(f"unknown model {value!r}; known: {', '.join(known_models())}")
        return value


def known_models() -> tuple[str, ...]:
    """The models a job may name: tailcut.training.models' registry, the one source of truth.

    Imported when called, not at the top: the registry imports numpy, and a spec
    loaded in a role process must not load numpy before the role limits its threads.
    """
    from tailcut.training import models
    return tuple(models.names())


class Transport(_Model):
    type: str = "tcp"

    @field_validator("type")
    @classmethod
    def _known_transport(cls, value: str) -> str:
        if value not in TRANSPORTS:
            raise ValueError(f"unsupported transport {value!r}; supported: "
                             f"{', '.join(TRANSPORTS)}")
        return value


_Name = Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$",
                             description="lower-case letters, digits and '-'")]


class Rack(_Model):
    name: _Name


class Network(_Model):
    racks: list[Rack] = Field(default_factory=lambda: [Rack(name="rack-0")], min_length=1,
                              max_length=MAX_RACKS)
    placement: dict[str, str] = Field(
        default_factory=dict,
        description="pod name -> rack name; pods not listed fill the racks in order")
    access_link: Link = Field(default_factory=Link, description="each pod to its rack")
    uplink: Link = Field(default_factory=Link, description="each rack to the spine")

    @field_validator("racks")
    @classmethod
    def _unique_racks(cls, racks: list[Rack]) -> list[Rack]:
        names = [r.name for r in racks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"rack names must be unique; repeated: {', '.join(dupes)}")
        return racks


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

    def pod_names(self) -> list[str]:
        """Pods in creation order: parameter servers first, then workers."""
        return ([f"ps-{i}" for i in range(self.replicas.parameter_servers)]
                + [f"worker-{i}" for i in range(self.replicas.workers)])

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
