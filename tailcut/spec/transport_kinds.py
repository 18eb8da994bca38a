"""What each transport is, as the spec, the planner and the executors need to know it,
without importing it: its traits, and where its class lives.

tailcut's own transports are declared in BUILTIN. A researcher's transport, in a package
of its own, is declared the same way and registered under the entry point group
``tailcut.transports`` (docs/transports.md): a job names it as ``transport: {type:
<name>}`` with no fork of tailcut. The spec, the planner and the operator read only these
declarations; the transport's module is imported where the roles run
(``tailcut.transports.load``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tailcut.spec import entrypoints

ENTRY_POINT_GROUP = "tailcut.transports"


@dataclass(frozen=True)
class TransportKind:
    """One transport's traits; every one defaults to "no"."""

    name: str
    # "package.module:Class", a tailcut.transports.base.Transport subclass, imported only
    # where the roles run (so a TCP job never imports the datagram transports).
    factory: str
    # The label of its runs in `tailcut compare`'s directories.
    short: str = ""
    # Lossy: delivers at least a fraction p of each message; the spec requires p and the
    # transport is built with p=.
    takes_p: bool = False
    # Built with seed= (the job's seed, one per pod): it draws random numbers.
    seeded: bool = False
    # Carries the vectors over kernel TCP connections: takes tcpCongestionControl
    # (built with congestion_control=), and its rate is TCP's, not a rateMbit.
    kernel_tcp: bool = False
    # tailcut's datagram wire format (tailcut.transports.datagram): data in UDP datagrams
    # paced at rateMbit or a receiver's grant, a TCP control channel beside them.
    datagrams: bool = False
    # Its receivers count each message's packets in XDP (their pods need the BPF
    # capabilities; xdpMode applies) and may close a message early (minP).
    xdp_counter: bool = False
    # Sends a message as CadentFlow-tagged parts, one per tensor (send_cuts).
    tags_flows: bool = False
    # Paces each flow at its own rate (SO_MAX_PACING_RATE): coflow scheduling.
    paces_flows: bool = False
    # Carries the all-reduce sync mode (tcp: DDP over Gloo; datagrams: tailcut's
    # transpose all-reduce).
    allreduce: bool = False

    def __post_init__(self) -> None:
        if self.datagrams and self.kernel_tcp:
            raise ValueError(f"transport {self.name!r}: datagrams and kernel_tcp exclude "
                             "each other")
        if ":" not in self.factory:
            raise ValueError(f"transport {self.name!r}: factory {self.factory!r} is not "
                             "'package.module:Class'")

    @property
    def label(self) -> str:
        return self.short or self.name


BUILTIN: tuple[TransportKind, ...] = (
    TransportKind("tcp", "tailcut.transports.tcp:TcpTransport", short="tcp",
                  kernel_tcp=True, tags_flows=True, paces_flows=True, allreduce=True),
    TransportKind("udp", "tailcut.transports.datagram:UdpTransport", short="udp",
                  seeded=True, datagrams=True, tags_flows=True, allreduce=True),
    TransportKind("bounded-loss", "tailcut.transports.datagram:BoundedLossTransport",
                  short="bl", takes_p=True, seeded=True, datagrams=True, xdp_counter=True,
                  tags_flows=True, allreduce=True),
    TransportKind("app-drop", "tailcut.transports.app_drop:AppDropTransport", short="ad",
                  takes_p=True, seeded=True, kernel_tcp=True),
)
BUILTIN_NAMES: tuple[str, ...] = tuple(k.name for k in BUILTIN)


RegistrationError = entrypoints.RegistrationError


@functools.cache
def registered() -> dict[str, TransportKind]:
    """Every transport by name: tailcut's, then those installed packages register
    (read once per process; ``registered.cache_clear()`` reads them again)."""
    return entrypoints.load(ENTRY_POINT_GROUP, BUILTIN, TransportKind, "transport", "transport")


def names() -> list[str]:
    """Every transport's name, tailcut's first."""
    return list(registered())


def get(name: str) -> TransportKind:
    """The transport ``name``; ValueError naming the known ones if there is none."""
    try:
        return registered()[name]
    except KeyError:
        raise ValueError(f"unsupported transport {name!r}; supported: "
                         f"{', '.join(names())}") from None


def with_trait(trait: str) -> list[str]:
    """The names of the transports that have ``trait`` (a TransportKind field)."""
    return [k.name for k in registered().values() if getattr(k, trait)]
