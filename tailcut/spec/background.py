"""The backgroundLoad section of a TrainingJob: other applications' traffic on the
training job's links, driven by Locust.

A background flow is one request: a Locust client in a receiver asks a server in a
sender for N bytes, and the N bytes flow sender -> receiver. Senders and receivers are
racks (a background pod is added to the rack) or training pods (the background process
shares that pod's access link, e.g. `ps-0` to load the PS's link). The target is a load
factor on one named link, in the direction the flows cross it, or a request rate:

    backgroundLoad:
      senders: [rack-0]
      receivers: [rack-1]
      target: {link: uplink/rack-0, loadFactor: 0.5}
      flowSizes: {distribution: web-search}
      shape: {type: onOff, onS: 2, offS: 3}
      durationS: 60
"""

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from tailcut.spec import flowsizes

MAX_REQUESTS_PER_S = 5_000.0   # what one Locust process drives, about; more is refused
MAX_DURATION_S = 86_400.0


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True,
                              alias_generator=to_camel, populate_by_name=True)


class Target(_Model):
    """How much background traffic: a load factor of a named link, or a request rate."""

    link: Optional[str] = Field(
        default=None, description="uplink/<rack> or access/<training pod>, e.g. uplink/rack-0")
    load_factor: Optional[float] = Field(
        default=None, gt=0.0, le=1.0,
        description="fraction of the link's bandwidth the background flows should use")
    requests_per_s: Optional[float] = Field(
        default=None, gt=0.0, le=MAX_REQUESTS_PER_S,
        description="background flows started per second, instead of a load factor")

    @model_validator(mode="after")
    def _one_kind(self) -> "Target":
        if (self.load_factor is None) == (self.requests_per_s is None):
            raise ValueError("loadFactor: give exactly one of loadFactor (with link) "
                             "or requestsPerS")
        if self.load_factor is not None and self.link is None:
            raise ValueError("link: a loadFactor needs the link it loads, e.g. "
                             "link: uplink/rack-0 or link: access/ps-0")
        return self


class FlowSizes(_Model):
    """The distribution background flow sizes are drawn from."""

    distribution: str = Field(default="web-search",
                              description="web-search, data-mining or fixed")
    bytes: Optional[int] = Field(default=None, ge=1, le=10**10,
                                 description="the size of every flow, for fixed")
    max_bytes: Optional[int] = Field(
        default=None, ge=1, le=10**10,
        description="cap on a drawn size (a 1 GB data-mining flow outlasts a short run)")

    @model_validator(mode="after")
    def _consistent(self) -> "FlowSizes":
        if self.distribution not in flowsizes.DISTRIBUTIONS:
            raise ValueError(f"distribution: unknown distribution {self.distribution!r}; "
                             f"known: {', '.join(flowsizes.DISTRIBUTIONS)}")
        if self.distribution == "fixed" and self.bytes is None:
            raise ValueError("bytes: distribution fixed needs bytes, the size of every flow")
        if self.distribution != "fixed" and self.bytes is not None:
            raise ValueError(f"bytes: only for distribution fixed; {self.distribution} "
                             "draws its sizes (cap them with maxBytes)")
        if self.distribution == "fixed" and self.max_bytes is not None:
            raise ValueError("maxBytes: a fixed size has nothing to cap; set bytes")
        return self

    def cdf(self) -> tuple[tuple[int, float], ...]:
        """The CDF points sizes are drawn from (a step at `bytes` for fixed)."""
        if self.distribution == "fixed":
            assert self.bytes is not None
            return ((self.bytes, 0.0), (self.bytes, 1.0))
        return flowsizes.truncated(flowsizes.CDFS[self.distribution], self.max_bytes)

    def mean_bytes(self) -> float:
        return flowsizes.mean_bytes(self.cdf())


class Step(_Model):
    at_s: float = Field(ge=0.0, description="seconds after the background starts")
    scale: float = Field(ge=0.0, le=10.0, description="multiplies the target from at_s on")


class Shape(_Model):
    """How the offered load changes over time, as a multiple of the target."""

    type: Literal["constant", "steps", "onOff"] = "constant"
    steps: Optional[list[Step]] = Field(default=None, min_length=1, max_length=1000)
    on_s: Optional[float] = Field(default=None, gt=0.0, description="burst length")
    off_s: Optional[float] = Field(default=None, gt=0.0, description="pause between bursts")

    @model_validator(mode="after")
    def _fields_of_type(self) -> "Shape":
        if self.type == "steps":
            if not self.steps:
                raise ValueError("steps: type steps needs a list of {atS, scale}")
            if self.steps[0].at_s != 0:
                raise ValueError(f"steps[0].atS: {self.steps[0].at_s:g}: the first step "
                                 "must start at 0")
            for i in range(1, len(self.steps)):
                if self.steps[i].at_s <= self.steps[i - 1].at_s:
                    raise ValueError(f"steps[{i}].atS: {self.steps[i].at_s:g} must be after "
                                     f"steps[{i - 1}].atS ({self.steps[i - 1].at_s:g})")
        elif self.steps is not None:
            raise ValueError(f"steps: only for type steps, not {self.type}")
        if self.type == "onOff":
            missing = [n for n, v in (("onS", self.on_s), ("offS", self.off_s)) if v is None]
            if missing:
                raise ValueError(f"{missing[0]}: type onOff needs onS and offS (seconds)")
        elif self.on_s is not None or self.off_s is not None:
            raise ValueError(f"{'onS' if self.on_s is not None else 'offS'}: only for "
                             f"type onOff, not {self.type}")
        return self

    def scale_at(self, t_s: float) -> float:
        """The multiple of the target offered `t_s` seconds after the start."""
        if self.type == "steps":
            assert self.steps is not None
            return [s.scale for s in self.steps if s.at_s <= t_s][-1]
        if self.type == "onOff":
            assert self.on_s is not None and self.off_s is not None
            return 1.0 if t_s % (self.on_s + self.off_s) < self.on_s else 0.0
        return 1.0

    def peak_scale(self) -> float:
        return max(s.scale for s in self.steps) if self.steps else 1.0


class Locust(_Model):
    users: Optional[int] = Field(
        default=None, ge=1, le=2000,
        description="concurrent Locust users (connections); default from the peak rate")
    seed: int = Field(default=0, description="seeds flow sizes and arrival times")


class BackgroundLoad(_Model):
    senders: list[str] = Field(min_length=1, max_length=64,
                               description="racks or training pods the flows come from")
    receivers: list[str] = Field(min_length=1, max_length=64,
                                 description="racks or training pods the flows go to "
                                             "(where the Locust clients run)")
    target: Target
    flow_sizes: FlowSizes = Field(default_factory=FlowSizes)
    shape: Shape = Field(default_factory=Shape)
    duration_s: Optional[float] = Field(
        default=None, gt=0.0, le=MAX_DURATION_S,
        description="how long the background runs; default: as long as the training")
    warmup_s: float = Field(default=2.0, ge=0.0, le=600.0,
                            description="seconds the background runs before training starts")
    locust: Locust = Field(default_factory=Locust)


def check_names(load: BackgroundLoad, racks: list[str], rack_of: dict[str, str],
                field: str = "backgroundLoad") -> None:
    """Refuse endpoints and links that do not exist, and a target link the flows do
    not all cross in one direction (its load factor would mean nothing)."""
    for side in ("senders", "receivers"):
        names = getattr(load, side)
        for i, name in enumerate(names):
            if name in racks and name in rack_of:
                raise ValueError(f"{field}.{side}[{i}]: {name!r} is both a rack and a pod")
            if name not in racks and name not in rack_of:
                raise ValueError(f"{field}.{side}[{i}]: {name!r} is neither a rack "
                                 f"({', '.join(racks)}) nor a training pod "
                                 f"({', '.join(rack_of)})")
            if names.index(name) != i:
                raise ValueError(f"{field}.{side}[{i}]: {name!r} is listed twice")
    both = sorted(set(load.senders) & set(load.receivers))
    if both:
        raise ValueError(f"{field}.receivers: {', '.join(both)} also sends; a flow needs "
                         "two ends")
    if load.target.link is not None:
        direction(load, racks, rack_of, f"{field}.target.link")


def direction(load: BackgroundLoad, racks: list[str], rack_of: dict[str, str],
              field: str = "backgroundLoad.target.link") -> str:
    """The direction in which every background flow crosses the target link: 'up'
    (out of the rack or pod) or 'down' (into it). Raises ValueError otherwise."""
    kind, _, name = (load.target.link or "").partition("/")
    rack_of_end = {n: (n if n in racks else rack_of[n]) for n in load.senders + load.receivers}
    if kind == "uplink":
        if name not in racks:
            raise ValueError(f"{field}: no rack {name!r}; racks are {', '.join(racks)}")
        def inside(end: str) -> bool:
            return rack_of_end[end] == name
    elif kind == "access":
        if name not in rack_of:
            raise ValueError(f"{field}: no training pod {name!r}; pods are "
                             f"{', '.join(rack_of)}")
        def inside(end: str) -> bool:
            return end == name
    else:
        raise ValueError(f"{field}: {load.target.link!r} is not a link name; write "
                         "uplink/<rack> or access/<training pod>")
    ways = set()
    for s in load.senders:
        for r in load.receivers:
            if inside(s) == inside(r):
                raise ValueError(f"{field}: flows from {s} to {r} do not cross "
                                 f"{load.target.link}, so it cannot carry a load factor")
            ways.add("up" if inside(s) else "down")
    if len(ways) > 1:  # cannot happen for one link with disjoint ends; kept as a guard
        raise ValueError(f"{field}: flows cross {load.target.link} in both directions")
    return ways.pop()
