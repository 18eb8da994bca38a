"""Resolve a TrainingJob into a concrete topology: which namespace, rack, slot and
address each pod gets. Pure: it builds nothing, so it is testable without root."""

from dataclasses import dataclass

from tailcut.net import naming
from tailcut.spec.model import DEFAULT_MTU, Link, TrainingJob


@dataclass(frozen=True)
class Pod:
    """A pod: one network namespace with one process in it."""

    name: str
    role: str          # "ps" or "worker"
    index: int         # index within its role
    rack: int          # index of its rack
    slot: int          # position within its rack: its port p<slot> on the ToR
    netns: str
    ip: str


@dataclass(frozen=True)
class Rack:
    """A rack: a namespace with the ToR bridge, joined to the spine by an uplink."""

    index: int
    name: str
    netns: str
    subnet: str
    gateway: str
    pods: tuple[Pod, ...]


@dataclass(frozen=True)
class Topology:
    job: str
    racks: tuple[Rack, ...]
    spine_netns: str
    access_link: Link
    uplink: Link
    mtu: int = DEFAULT_MTU   # of every link: veth ends, bridges, the overlay's vx0

    @property
    def pods(self) -> tuple[Pod, ...]:
        return tuple(p for r in self.racks for p in r.pods)

    def pod(self, name: str) -> Pod:
        return next(p for p in self.pods if p.name == name)

    def namespaces(self) -> list[str]:
        """Every namespace of the job, in build order."""
        return ([self.spine_netns] + [r.netns for r in self.racks]
                + [p.netns for p in self.pods])


def plan(job: TrainingJob) -> Topology:
    name = job.name
    rack_of = job.spec.rack_of()
    racks = []
    for r, rack_spec in enumerate(job.spec.network.racks):
        members = [p for p in job.spec.pod_names() if rack_of[p] == rack_spec.name]
        pods = tuple(
            Pod(name=p, role=p.split("-")[0], index=int(p.rsplit("-", 1)[1]), rack=r,
                slot=slot, netns=naming.pod_netns(name, p), ip=naming.pod_ip(r, slot))
            for slot, p in enumerate(members))
        pods += tuple(  # background pods come after the training pods of the rack
            Pod(name=p, role=role, index=i, rack=r, slot=len(members) + k,
                netns=naming.pod_netns(name, p), ip=naming.pod_ip(r, len(members) + k))
            for k, (p, role, i) in enumerate(background_pods(job, rack_spec.name)))
        racks.append(Rack(index=r, name=rack_spec.name, netns=naming.rack_netns(name, r),
                          subnet=naming.rack_subnet(r), gateway=naming.gateway_ip(r),
                          pods=pods))
    return Topology(job=name, racks=tuple(racks), spine_netns=naming.spine_netns(name),
                    access_link=job.spec.network.access_link,
                    uplink=job.spec.network.uplink, mtu=job.spec.network.mtu)


BACKGROUND_ROLES = ("bg-server", "bg-client")


def background_pods(job: TrainingJob, rack: str) -> list[tuple[str, str, int]]:
    """(pod name, role, index) of the background pods `rack` gets: a server pod
    'bg-server-<i>' if it is the i-th background sender, a Locust client pod
    'bg-client-<i>' if it is the i-th receiver. Senders and receivers that name a
    training pod get no pod of their own: they run inside that pod."""
    load = job.spec.background_load
    if load is None:
        return []
    return ([(f"bg-server-{i}", "bg-server", i) for i, s in enumerate(load.senders)
             if s == rack]
            + [(f"bg-client-{i}", "bg-client", i) for i, s in enumerate(load.receivers)
               if s == rack])
