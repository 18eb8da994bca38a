"""Link shaping: plan the qdiscs for one direction of a link, then apply them.

Every shaped interface gets the same HTB tree on its egress. For a 1 Gbit link with
1% loss and 5 ms delay on a kernel with netem, `plan` returns what tc would write as

    tc qdisc replace dev X root handle 1: htb default 10
    tc class replace dev X parent 1:  classid 1:1  htb rate 1gbit ceil 1gbit
    tc class replace dev X parent 1:1 classid 1:10 htb rate 1gbit ceil 1gbit
    tc qdisc replace dev X parent 1:10 handle 10: netem delay 5ms loss 1%

1:1 holds the link rate so that priority classes (CadentFlow) can later share it as
siblings of 1:10. Without netem, loss becomes a Drop op (the eBPF dropper on the
clsact egress hook, in front of HTB) and delay or jitter is refused.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from tailcut.errors import KernelFeatureMissing
from tailcut.spec.model import Link

if TYPE_CHECKING:
    from pyroute2 import IPRoute

ROOT = 0x10000          # 1:
LINK_CLASS = 0x10001    # 1:1
DEFAULT_CLASS = 0x10010  # 1:10
NETEM_HANDLE = 0x100000  # 10:
MTU_BYTES = 1514
HTB_QUANTUM_MAX = 200_000  # bytes; the kernel warns about (and clamps) larger quanta
GSO_BYTES = 65_536         # a veth hands HTB up to 64 KiB at once


@dataclass(frozen=True)
class Htb:
    rate_bit: int

    @property
    def burst_bytes(self) -> int:
        # One millisecond at line rate, but never less than one GSO packet: a smaller
        # bucket makes HTB undershoot its rate with TSO/GSO super-packets.
        return max(self.rate_bit // 8 // 1000, GSO_BYTES + MTU_BYTES)

    @property
    def quantum_bytes(self) -> int:
        return max(MTU_BYTES, min(HTB_QUANTUM_MAX, self.rate_bit // 8 // 10))


@dataclass(frozen=True)
class Netem:
    delay_ms: float
    jitter_ms: float
    loss: float


@dataclass(frozen=True)
class Drop:
    loss: float


Op = Union[Htb, Netem, Drop]


def plan(link: Link, has_netem: bool, field: str) -> list[Op]:
    """The ops that shape one egress of `link`. `field` names the link in the spec
    (e.g. 'spec.network.uplink') for the error when the kernel cannot do it."""
    ops: list[Op] = [Htb(rate_bit=link.bandwidth)]
    wants_netem = link.delay_ms > 0 or link.jitter_ms > 0
    if has_netem and (wants_netem or link.loss > 0):
        ops.append(Netem(delay_ms=link.delay_ms, jitter_ms=link.jitter_ms, loss=link.loss))
    elif wants_netem:
        which = "delayMs" if link.delay_ms > 0 else "jitterMs"
        raise KernelFeatureMissing(
            f"{field}.{which}={getattr(link, which.replace('Ms', '_ms'))}: this kernel has "
            "no netem qdisc (CONFIG_NET_SCH_NETEM), so delay and jitter cannot be "
            "emulated; set them to 0 or use a kernel with netem (`tailcut doctor` "
            "shows what this one has)")
    elif link.loss > 0:
        ops.append(Drop(loss=link.loss))
    return ops


def drops_packets(ops: list[Op]) -> bool:
    """Whether these ops lose packets. A lossy path needs its senders to hand the
    kernel one wire packet per skb: loss acts on skbs, and a TSO/GSO skb carries up
    to ~43 TCP segments, so 1% loss would drop 1% of bursts rather than of packets."""
    return any(isinstance(op, Drop) or (isinstance(op, Netem) and op.loss > 0) for op in ops)


def describe(ops: list[Op]) -> str:
    """What was applied, in words, for the results and the job status."""
    parts = []
    for op in ops:
        if isinstance(op, Htb):
            parts.append(f"htb {op.rate_bit / 1e6:g} Mbit/s")
        elif isinstance(op, Netem):
            parts.append(f"netem delay {op.delay_ms:g} ms jitter {op.jitter_ms:g} ms "
                         f"loss {op.loss:g}")
        else:
            parts.append(f"ebpf dropper loss {op.loss:g}")
    return ", ".join(parts)


def apply(ops: list[Op], ipr: "IPRoute", netns_name: str, ifname: str) -> list[object]:
    """Apply `ops` to the egress of `ifname`, using `ipr` bound in `netns_name`.
    Qdiscs and classes are replaced, so re-applying them is harmless; an eBPF
    dropper is attached, so detach the returned ones (the caller keeps them to read
    their counters) before applying again."""
    index = ipr.link_lookup(ifname=ifname)[0]
    attached: list[object] = []
    for op in ops:
        if isinstance(op, Htb):
            ipr.tc("replace", "htb", index, ROOT, default=DEFAULT_CLASS & 0xFFFF)
            for classid, parent in ((LINK_CLASS, ROOT), (DEFAULT_CLASS, LINK_CLASS)):
                ipr.tc("replace-class", "htb", index, classid, parent=parent,
                       rate=f"{op.rate_bit}bit", ceil=f"{op.rate_bit}bit",
                       burst=op.burst_bytes, cburst=op.burst_bytes,
                       quantum=op.quantum_bytes)
        elif isinstance(op, Netem):
            ipr.tc("replace", "netem", index, NETEM_HANDLE, parent=DEFAULT_CLASS,
                   delay=int(op.delay_ms * 1000), jitter=int(op.jitter_ms * 1000),
                   loss=op.loss * 100)
        else:
            from tailcut.datapath import dropper  # BCC loads only when a link drops
            attached.append(dropper.attach(netns_name, ifname, op.loss))
    return attached


# -- CadentFlow priority classes ----------------------------------------------------
# Siblings of the default class 1:10 under the link class 1:1, one per priority level:
#
#   1:1  htb rate R ceil R                       (the link, as above)
#   ├── 1:10 htb rate R/1000 ceil R prio 7       default, untagged traffic
#   ├── 1:20 htb rate R/1000 ceil R prio 0       level 0 (most urgent)
#   ├── 1:21 htb rate R/1000 ceil R prio 1       level 1
#   ...
#
# HTB first gives every class its `rate`, then lends the rest of the link to the
# classes of the lowest `prio` first: with tiny rates that is strict priority. With
# weights the classes share one prio and rate = R * weight / sum(weights), so they
# split the link by weight. The default class's rate drops from R to R/1000: a class
# under its rate sends without asking its parent, so a full-rate 1:10 next to the
# priority classes would let the pod send more than R.
PRIORITY_CLASS_BASE = 0x20  # minor of level 0: 1:20 (ebpf/classifier.h: TAILCUT_CLASS_BASE)
PRIORITY_FLOOR = 1000       # classes guarantee rate / PRIORITY_FLOOR each
HTB_MAX_PRIO = 7


@dataclass(frozen=True)
class PrioClass:
    """One HTB class of a priority level (level None = the default class 1:10)."""

    level: int | None
    classid: int
    rate_bit: int
    ceil_bit: int
    prio: int
    # The bucket of the class's own rate. Under strict priority that rate is tiny and
    # the bucket one frame: a class with tokens sends before every borrowing class
    # whatever their prio, so a GSO-sized bucket let an idle low level send ~67 kB
    # ahead of a busy urgent one. The ceil bucket (cburst) stays large: it sets the rate.
    burst_bytes: int = MTU_BYTES

    @property
    def cburst_bytes(self) -> int:
        return Htb(self.ceil_bit).burst_bytes

    @property
    def quantum_bytes(self) -> int:
        return max(MTU_BYTES, min(HTB_QUANTUM_MAX, self.rate_bit // 8 // 10))


def plan_priorities(link_rate_bit: int, levels: int,
                    weights: list[float] | None = None) -> list[PrioClass]:
    """The classes for `levels` priority levels on a link of `link_rate_bit`, the
    default class first. `weights` (one per level) turns strict priority into shares."""
    if not 1 <= levels <= HTB_MAX_PRIO:
        raise ValueError(f"levels={levels}: must be in 1..{HTB_MAX_PRIO} (HTB has 8 prio "
                         "values and the default class keeps the last one)")
    if weights is not None:
        if len(weights) != levels or any(w <= 0 for w in weights):
            raise ValueError(f"weights={weights}: need {levels} positive numbers, one per level")
    floor = max(8_000, link_rate_bit // PRIORITY_FLOOR)
    classes = [PrioClass(None, DEFAULT_CLASS, floor, link_rate_bit, HTB_MAX_PRIO)]
    for level in range(levels):
        if weights is None:
            rate, prio, burst = floor, level, MTU_BYTES
        else:
            rate, prio = max(floor, int(link_rate_bit * weights[level] / sum(weights))), 0
            burst = Htb(rate).burst_bytes   # shares: each class must reach its rate
        classes.append(PrioClass(level, 0x10000 | (PRIORITY_CLASS_BASE + level), rate,
                                 link_rate_bit, prio, burst))
    return classes


def apply_priorities(classes: list[PrioClass], ipr: "IPRoute", ifname: str) -> None:
    """Add (replace) the priority classes under 1:1 of `ifname`, whose HTB tree
    `apply` built. Re-applying is harmless."""
    index = ipr.link_lookup(ifname=ifname)[0]
    for cls in classes:
        ipr.tc("replace-class", "htb", index, cls.classid, parent=LINK_CLASS,
               rate=f"{cls.rate_bit}bit", ceil=f"{cls.ceil_bit}bit", prio=cls.prio,
               burst=cls.burst_bytes, cburst=cls.cburst_bytes, quantum=cls.quantum_bytes)


def describe_priorities(classes: list[PrioClass]) -> str:
    return ", ".join(f"1:{c.classid & 0xFFFF:x} prio {c.prio} rate {c.rate_bit / 1e6:g} Mbit/s"
                     for c in classes)
