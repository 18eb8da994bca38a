"""Link shaping: plan the qdiscs for one direction of a link (tailcut.net.tc applies
them; this module imports nothing privileged, so planners can use it).

Every shaped interface gets the same HTB tree on its egress. For a 1 Gbit link with
1% loss and 5 ms delay on a kernel with netem, `plan` returns what tc would write as

    tc qdisc replace dev X root handle 1: htb default 10
    tc class replace dev X parent 1:  classid 1:1  htb rate 1gbit ceil 1gbit
    tc class replace dev X parent 1:1 classid 1:10 htb rate 1gbit ceil 1gbit
    tc qdisc replace dev X parent 1:10 handle 10: netem delay 5ms loss 1%

1:1 holds the link rate so that priority classes (CadentFlow) can later share it as
siblings of 1:10. Without netem, loss becomes a Drop op (the eBPF dropper on the
clsact egress hook, in front of HTB) and delay or jitter is refused.

A link's buffer (bufferPackets or bufferBytes) is a Queue op: a tail-drop FIFO as the
leaf of every HTB class, where packets wait for the class's rate, as they wait in a
switch port's output queue. Each class has its own (not one buffer shared by the
classes of a port). With a buffer of 8 packets and no netem:

    tc qdisc replace dev X parent 1:10 handle 10: pfifo limit 8     (bfifo: bytes)
    tc qdisc replace dev X parent 1:20 handle 20: pfifo limit 8     (each priority class)

The leaf of class 1:m has handle m:. Without a buffer the leaves are the kernel's
default (a pfifo of txqueuelen packets, 1000 on a veth, with no handle). With netem,
10: is netem and the queue becomes netem's child (11:, under netem's class 10:1):
netem holds each packet for its delay and then hands it to the child, where it waits
for HTB's rate. netem's own `limit` would count the packets still on their delay as
well, so a buffer of B packets would shrink with the delay; the child counts only the
packets waiting for the link. netem's limit is then raised out of the way
(DELAY_LINE_PACKETS): a wire does not drop what is in flight on it.
"""

from dataclasses import dataclass, replace
from typing import Literal, Optional, Union

from tailcut.errors import KernelFeatureMissing
from tailcut.spec.model import DEFAULT_MTU, Link

ROOT = 0x10000          # 1:
LINK_CLASS = 0x10001    # 1:1
DEFAULT_CLASS = 0x10010  # 1:10
DEFAULT_LEAF = 0x100000  # 10:, the leaf of 1:10: netem, or else a buffer's queue
NETEM_HANDLE = DEFAULT_LEAF
NETEM_CLASS = 0x100001   # 10:1, netem's one class, where its child hangs
NETEM_CHILD_HANDLE = 0x110000  # 11:
NETEM_DEFAULT_LIMIT = 1000     # packets, the kernel's (and pyroute2's) default
DELAY_LINE_PACKETS = 1_000_000  # netem's limit when a child queue is the buffer
MTU_BYTES = 1514          # a full frame at the default MTU: 1500 + 14 of Ethernet header
ETH_HEADER_BYTES = 14
HTB_QUANTUM_MAX = 200_000  # bytes; the kernel warns about (and clamps) larger quanta
# The largest GSO packet a pod's link takes (gso_max_size on both ends, set by build):
# HTB sends a packet whole once its bucket is not empty, so a sender that was idle puts
# its bucket plus one GSO packet on the wire at once. With the kernel's 64 KiB and a
# bucket of 1 ms a 259 KB message crossed a 1 Gbit/s link at 2.5 Gbit/s;
# with 32 KiB and the bucket below, at 1.0 (docs/network.md#a-link-is-no-faster-than-its-rate).
GSO_BYTES = 32_768
FIFO_KINDS = {"packets": "pfifo", "bytes": "bfifo"}


def frame_bytes(mtu: int) -> int:
    """A full-size frame as a qdisc on a veth counts it: the MTU plus the Ethernet header."""
    return mtu + ETH_HEADER_BYTES


@dataclass(frozen=True)
class Htb:
    rate_bit: int
    frame_bytes: int = MTU_BYTES   # the job's full-size frame (frame_bytes(mtu))

    @property
    def burst_bytes(self) -> int:
        # One GSO packet plus a frame, the least with which HTB still reaches its rate
        # with GSO packets; any more goes out faster than the link (GSO_BYTES).
        return GSO_BYTES + self.frame_bytes

    @property
    def quantum_bytes(self) -> int:
        # At least one frame, so one round of HTB's deficit round robin sends a packet.
        return max(self.frame_bytes, min(HTB_QUANTUM_MAX, self.rate_bit // 8 // 10))


@dataclass(frozen=True)
class Netem:
    delay_ms: float
    jitter_ms: float
    loss: float
    limit_packets: int = NETEM_DEFAULT_LIMIT


@dataclass(frozen=True)
class Drop:
    loss: float


@dataclass(frozen=True)
class Queue:
    """A tail-drop FIFO of `limit` packets (pfifo) or bytes (bfifo): the buffer a
    packet waits in for its class's rate. `parent` and `handle` place it in the tree."""

    limit: int
    unit: Literal["packets", "bytes"]
    parent: int = DEFAULT_CLASS
    handle: int = DEFAULT_LEAF

    @property
    def kind(self) -> str:
        return FIFO_KINDS[self.unit]

    def under(self, classid: int) -> "Queue":
        """The same queue as the leaf of HTB class `classid` (1:m gets handle m:)."""
        return replace(self, parent=classid, handle=(classid & 0xFFFF) << 16)


Op = Union[Htb, Netem, Drop, Queue]


def buffer(link: Link) -> Optional[Queue]:
    """The queue `link`'s buffer fields ask for, as the leaf of the default class; None
    for the kernel's default queue."""
    if link.buffer_packets is not None:
        return Queue(link.buffer_packets, "packets")
    if link.buffer_bytes is not None:
        return Queue(link.buffer_bytes, "bytes")
    return None


def host_end(link: Link) -> Link:
    """`link` as shaped at a pod's own end: the pod's interface is its host's NIC, not
    a switch port, so it keeps the kernel's queue whatever buffer the link's switch
    ports have. (A shallow queue there drops a sender's own bursts before the switch
    sees them, and the kernel tells a local TCP sender of such a drop at once, so it
    never waits for a retransmission timeout: not what a switch buffer does.) Its
    random loss is not applied there either but where its wire ends (`wire_end`)."""
    return link.model_copy(update={"buffer_packets": None, "buffer_bytes": None,
                                   "loss": 0.0})


def wire_end(link: Link) -> list[Op]:
    """What `link` loses at random on its way from a pod, applied on the ingress of the
    switch port the pod's wire ends at: an eBPF dropper (on every kernel, netem or not).
    There every packet is a wire packet: the pod's interface cuts a UDP GSO message
    (a datagram sender hands the kernel up to 32 KiB at once) after its own shaper, so
    loss acts on datagrams, not on whole GSO messages, and the sender keeps GSO's
    one-skb-per-burst cost under loss. A TCP sender's retransmission counts are the
    same as with the loss on its own egress (measured: 768 of 768 and 741 of 741
    drops retransmitted, 5% loss, 20 MB)."""
    return [Drop(loss=link.loss)] if link.loss > 0 else []


def plan(link: Link, has_netem: bool, field: str, mtu: int = DEFAULT_MTU) -> list[Op]:
    """The ops that shape one egress of `link`, a link of MTU `mtu`. `field` names the
    link in the spec (e.g. 'spec.network.uplink') for the error when the kernel cannot
    do it."""
    ops: list[Op] = [Htb(rate_bit=link.bandwidth, frame_bytes=frame_bytes(mtu))]
    queue = buffer(link)
    wants_netem = link.delay_ms > 0 or link.jitter_ms > 0
    if has_netem and (wants_netem or link.loss > 0):
        ops.append(Netem(delay_ms=link.delay_ms, jitter_ms=link.jitter_ms, loss=link.loss,
                         limit_packets=NETEM_DEFAULT_LIMIT if queue is None
                         else DELAY_LINE_PACKETS))
        if queue is not None:
            queue = replace(queue, parent=NETEM_CLASS, handle=NETEM_CHILD_HANDLE)
    elif wants_netem:
        which = "delayMs" if link.delay_ms > 0 else "jitterMs"
        raise KernelFeatureMissing(
            f"{field}.{which}={getattr(link, which.replace('Ms', '_ms'))}: this kernel has "
            "no netem qdisc (CONFIG_NET_SCH_NETEM), so delay and jitter cannot be "
            "emulated; set them to 0 or use a kernel with netem (`tailcut doctor` "
            "shows what this one has)")
    elif link.loss > 0:
        ops.append(Drop(loss=link.loss))
    if queue is not None:
        ops.append(queue)
    return ops


def smallest_buffer_bytes(links: list[Link], mtu: int = DEFAULT_MTU) -> Optional[int]:
    """The smallest switch buffer of ``links`` in bytes (a buffer in packets counted
    as full frames of ``mtu``); None where every one has the kernel's deep default."""
    sizes = [q.limit * (mtu + 14) if q.unit == "packets" else q.limit
             for q in (buffer(link) for link in links) if q is not None]
    return min(sizes) if sizes else None


def rate_bit(ops: list[Op]) -> int:
    """The link rate the ops shape to, in bit/s."""
    return next(op.rate_bit for op in ops if isinstance(op, Htb))


def drops_packets(ops: list[Op]) -> bool:
    """Whether these ops lose packets (random loss, or a buffer that overflows). Such
    a path needs its senders to hand the kernel one wire packet per skb: loss acts on
    skbs, and a TSO/GSO skb carries up to ~43 TCP segments, so 1% loss would drop 1%
    of bursts rather than of packets, and a buffer of 8 packets would hold 8 bursts."""
    return any(isinstance(op, (Drop, Queue)) or (isinstance(op, Netem) and op.loss > 0)
               for op in ops)


def describe(ops: list[Op]) -> str:
    """What was applied, in words, for the results and the job status."""
    parts = []
    for op in ops:
        if isinstance(op, Htb):
            parts.append(f"htb {op.rate_bit / 1e6:g} Mbit/s")
        elif isinstance(op, Netem):
            parts.append(f"netem delay {op.delay_ms:g} ms jitter {op.jitter_ms:g} ms "
                         f"loss {op.loss:g}"
                         + (f" limit {op.limit_packets}" if op.limit_packets !=
                            NETEM_DEFAULT_LIMIT else ""))
        elif isinstance(op, Queue):
            parts.append(describe_queue(op))
        else:
            parts.append(f"ebpf dropper loss {op.loss:g}")
    return ", ".join(parts)


def describe_queue(queue: Queue) -> str:
    return f"{queue.kind} buffer {queue.limit} {queue.unit} per class"


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
    queue: Optional[Queue] = None   # its leaf; None: the kernel's default (or apply's)
    frame_bytes: int = MTU_BYTES    # the job's full-size frame

    @property
    def cburst_bytes(self) -> int:
        return Htb(self.ceil_bit, self.frame_bytes).burst_bytes

    @property
    def quantum_bytes(self) -> int:
        return Htb(self.rate_bit, self.frame_bytes).quantum_bytes


def plan_priorities(link_rate_bit: int, levels: int, weights: list[float] | None = None,
                    queue: Optional[Queue] = None,
                    mtu: int = DEFAULT_MTU) -> list[PrioClass]:
    """The classes for `levels` priority levels on a link of `link_rate_bit`, the
    default class first. `weights` (one per level) turns strict priority into shares.
    `queue` (the link's buffer) becomes the leaf of each level's class; the default
    class keeps the leaf `apply` gave it."""
    if not 1 <= levels <= HTB_MAX_PRIO:
        raise ValueError(f"levels={levels}: must be in 1..{HTB_MAX_PRIO} (HTB has 8 prio "
                         "values and the default class keeps the last one)")
    if weights is not None:
        if len(weights) != levels or any(w <= 0 for w in weights):
            raise ValueError(f"weights={weights}: need {levels} positive numbers, one per level")
    floor = max(8_000, link_rate_bit // PRIORITY_FLOOR)
    frame = frame_bytes(mtu)
    classes = [PrioClass(None, DEFAULT_CLASS, floor, link_rate_bit, HTB_MAX_PRIO, frame,
                         frame_bytes=frame)]
    for level in range(levels):
        if weights is None:
            rate, prio, burst = floor, level, frame
        else:
            rate, prio = max(floor, int(link_rate_bit * weights[level] / sum(weights))), 0
            burst = Htb(rate, frame).burst_bytes   # shares: each class must reach its rate
        classid = 0x10000 | (PRIORITY_CLASS_BASE + level)
        classes.append(PrioClass(level, classid, rate, link_rate_bit, prio, burst,
                                 None if queue is None else queue.under(classid), frame))
    return classes


def describe_priorities(classes: list[PrioClass]) -> str:
    queues = {describe_queue(c.queue) for c in classes if c.queue is not None}
    return ", ".join([f"1:{c.classid & 0xFFFF:x} prio {c.prio} rate {c.rate_bit / 1e6:g} "
                      "Mbit/s" for c in classes] + sorted(queues))
