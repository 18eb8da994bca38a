"""Resolve a job's backgroundLoad against its topology: which namespaces run servers
and Locust, which interface carries the target link, and the request rate.

Pure: it builds and starts nothing. The request rate comes from the target:

    requests_per_s = loadFactor * link bandwidth / 8 / (mean flow bytes + header bytes)

where the header bytes are the HTTP response head a flow adds on the wire (TCP/IP
headers are not added: the interface counters that measure the load count a TSO/GSO
super-packet of up to 64 KiB with one set of headers).
"""

import math
from dataclasses import dataclass
from typing import Any, Optional

from tailcut.errors import SpecError
from tailcut.net import naming
from tailcut.net.topology import Pod, Topology
from tailcut.spec import background
from tailcut.spec.model import TrainingJob

SERVER_PORT = 8080
LOCUST_MASTER_PORT = 5557
RESPONSE_HEAD_BYTES = 120     # "HTTP/1.1 200 OK", Server, Date, Content-Type/-Length
USERS_PER_REQUEST_PER_S = 1.0  # default users: one per request/s of peak rate...
MIN_USERS, MAX_USERS = 16, 256  # ...within these bounds (each user is a connection)
RUN_GRACE_S = 30.0             # how long past the training timeout a default run may go


@dataclass(frozen=True)
class Endpoint:
    """Where a background process runs: its own pod, or a training pod it shares."""

    pod: str
    netns: str
    ip: str


@dataclass(frozen=True)
class MeasuredLink:
    """One direction of a link, measured at the interface that transmits it."""

    name: str            # as in the spec: uplink/rack-0, access/ps-0
    direction: str       # up (out of the rack/pod) or down (into it)
    netns: str
    ifname: str
    bandwidth_bit: int


@dataclass(frozen=True)
class Plan:
    job: str
    servers: tuple[Endpoint, ...]
    clients: tuple[Endpoint, ...]
    link: Optional[MeasuredLink]
    target_load_factor: Optional[float]
    requests_per_s: float         # at shape scale 1
    mean_flow_bytes: float
    users: int
    run_time_s: float
    warmup_s: float
    load: background.BackgroundLoad

    def locust_config(self) -> dict[str, Any]:
        """What tailcut/background/locustfile.py reads from $TAILCUT_BACKGROUND."""
        return {"servers": [f"http://{s.ip}:{SERVER_PORT}" for s in self.servers],
                "requests_per_s": self.requests_per_s, "users": self.users,
                "shape": self.load.shape.model_dump(by_alias=True, mode="json"),
                "cdf": [list(p) for p in self.load.flow_sizes.cdf()],
                "seed": self.load.locust.seed}


def plan(job: TrainingJob, topo: Topology) -> Optional[Plan]:
    """The background plan of `job` on `topo`, or None if it has no backgroundLoad."""
    load = job.spec.background_load
    if load is None:
        return None
    servers = tuple(_endpoint(topo, name, "bg-server", i) for i, name in enumerate(load.senders))
    clients = tuple(_endpoint(topo, name, "bg-client", i)
                    for i, name in enumerate(load.receivers))
    link = _measured_link(job, topo, load)
    mean = load.flow_sizes.mean_bytes()
    if load.target.requests_per_s is not None:
        rate = load.target.requests_per_s
    else:
        assert link is not None and load.target.load_factor is not None
        rate = load.target.load_factor * link.bandwidth_bit / 8 / (mean + RESPONSE_HEAD_BYTES)
    peak = rate * load.shape.peak_scale()
    if peak > background.MAX_REQUESTS_PER_S:
        raise SpecError(f"spec.backgroundLoad.target: needs {peak:.0f} requests/s at peak "
                        f"(mean flow {mean:.0f} bytes); Locust here drives at most "
                        f"{background.MAX_REQUESTS_PER_S:.0f}: use larger flows "
                        "(flowSizes) or a lower load factor")
    users = load.locust.users or min(MAX_USERS, max(MIN_USERS, math.ceil(
        peak * USERS_PER_REQUEST_PER_S)))
    run_time = load.duration_s or (job.spec.training.timeout_s + load.warmup_s + RUN_GRACE_S)
    return Plan(job=job.name, servers=servers, clients=clients, link=link,
                target_load_factor=load.target.load_factor, requests_per_s=rate,
                mean_flow_bytes=mean, users=users, run_time_s=run_time,
                warmup_s=load.warmup_s, load=load)


def _endpoint(topo: Topology, name: str, role: str, index: int) -> Endpoint:
    """A sender/receiver named `name`: a training pod, or the rack's background pod."""
    try:
        pod = topo.pod(name)
    except StopIteration:
        pod = next(p for p in topo.pods if p.role == role and p.index == index)
    return Endpoint(pod=pod.name, netns=pod.netns, ip=pod.ip)


def _measured_link(job: TrainingJob, topo: Topology,
                   load: background.BackgroundLoad) -> Optional[MeasuredLink]:
    if load.target.link is None:
        return None
    racks = [r.name for r in job.spec.network.racks]
    way = background.direction(load, racks, job.spec.rack_of())
    kind, _, name = load.target.link.partition("/")
    if kind == "uplink":
        rack = next(r for r in topo.racks if r.name == name)
        ns, ifname = ((rack.netns, naming.RACK_UPLINK_IF) if way == "up"
                      else (topo.spine_netns, naming.spine_port(rack.index)))
        bandwidth = topo.uplink.bandwidth
    else:
        pod: Pod = topo.pod(name)
        ns, ifname = ((pod.netns, naming.POD_IF) if way == "up"
                      else (topo.racks[pod.rack].netns, naming.rack_port(pod.slot)))
        bandwidth = topo.access_link.bandwidth
    return MeasuredLink(name=load.target.link, direction=way, netns=ns, ifname=ifname,
                        bandwidth_bit=bandwidth)
