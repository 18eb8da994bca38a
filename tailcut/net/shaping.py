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

import struct
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal, Optional, Union

from pyroute2.netlink.rtnl import tcmsg
from pyroute2.netlink.rtnl.tcmsg import sched_pfifo

from tailcut.errors import KernelFeatureMissing
from tailcut.net import rtnl
from tailcut.spec.model import DEFAULT_MTU, Link

if TYPE_CHECKING:
    from pyroute2 import IPRoute

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

# pyroute2 0.9 knows pfifo's options but not bfifo's; both are the kernel's struct
# tc_fifo_qopt (one u32 limit, include/uapi/linux/pkt_sched.h), so bfifo borrows them.
tcmsg.plugins.setdefault("bfifo", sched_pfifo)


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


def apply(ops: list[Op], ipr: "IPRoute", netns_name: str, ifname: str,
          index: Optional[int] = None) -> list[object]:
    """Apply `ops` to the egress of `ifname` (or interface `index`), using `ipr` bound
    in `netns_name`. Qdiscs and classes are replaced, so re-applying them is harmless;
    an eBPF dropper is attached, so detach the returned ones (the caller keeps them to
    read their counters) before applying again."""
    if index is None:
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
                   loss=op.loss * 100, limit=op.limit_packets)
        elif isinstance(op, Queue):
            apply_queue(op, ipr, index)
        else:
            from tailcut.datapath import dropper  # BCC loads only when a link drops
            attached.append(dropper.attach(netns_name, ifname, op.loss))
    return attached


def add_requests(batch: rtnl.Batch, ops: list[Op], ifindex: int) -> None:
    """Add to `batch` the qdiscs and classes `apply` would make on interface `ifindex`
    (not the eBPF dropper: attach_droppers). pyroute2 encodes each distinct op list
    once (its HTB rate tables take a millisecond); every interface reuses the bytes
    with its own ifindex."""
    for kind, flags, body in _templates(tuple(ops)):
        batch.raw(kind, flags, body[:4] + struct.pack("=i", ifindex) + body[8:],
                  f"tc on ifindex {ifindex}")


def attach_droppers(ops: list[Op], netns_name: str, ifname: str) -> list[object]:
    """The eBPF droppers of `ops` on `ifname`'s egress, as `apply` attaches them."""
    attached: list[object] = []
    for op in ops:
        if isinstance(op, Drop):
            from tailcut.datapath import dropper  # BCC loads only when a link drops
            attached.append(dropper.attach(netns_name, ifname, op.loss))
    return attached


def add_dropper_requests(batch: rtnl.Batch, ops: list[Op], netns_name: str, ifname: str,
                         ifindex: int, direction: Literal["egress", "ingress"] = "egress",
                         ) -> list[object]:
    """attach_droppers for an interface just created, as requests added to `batch`
    (the caller sends it, and releases the returned droppers if that fails); on its
    ingress for `wire_end`'s ops."""
    attached: list[object] = []
    for op in ops:
        if isinstance(op, Drop):
            from tailcut.datapath import dropper  # BCC loads only when a link drops
            attached.append(dropper.attach_in_batch(batch, netns_name, ifname, ifindex,
                                                    op.loss, direction))
    return attached


_TCMSG_IFINDEX = 4   # offset of struct tcmsg's ifindex in a message's body


@lru_cache(maxsize=64)
def _templates(ops: tuple[Op, ...]) -> tuple[tuple[int, int, bytes], ...]:
    """(type, flags, body after the netlink header) of each request of `ops`, for
    interface index 0 (add_requests puts in the real one)."""
    from pyroute2 import IPBatch
    batch = IPBatch()
    apply([op for op in ops if not isinstance(op, Drop)], batch, "", "", index=0)
    data, out, offset = batch.batch, [], 0
    while offset < len(data):
        length, kind, flags = struct.unpack_from("=IHH", data, offset)
        body = data[offset + 16:offset + length]
        assert struct.unpack_from("=i", body, _TCMSG_IFINDEX)[0] == 0
        out.append((kind, flags & ~rtnl.NLM_F_ACK, body))
        offset += (length + 3) & ~3
    return tuple(out)


def apply_queue(queue: Queue, ipr: "IPRoute", index: int) -> None:
    ipr.tc("replace", queue.kind, index, queue.handle, parent=queue.parent,
           limit=queue.limit)


def queue_drops(ipr: "IPRoute", ifname: str) -> Optional[int]:
    """Packets the queues of `ifname`'s HTB tree dropped because they were full: the
    drops of every pfifo/bfifo leaf (ours, under a class or under netem), plus those of
    each leaf class still on the kernel's default queue (not listed among qdiscs, so
    read from the class: HTB counts what its leaf refused). netem's own drops (its
    random loss) and the eBPF dropper's (before HTB) are not queue drops; without a
    buffer on a kernel with netem, netem's own queue overflows uncounted here.
    None if `ifname` is gone or has no tree of ours."""
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        return None
    qdiscs = ipr.get_qdiscs(index=found[0])
    if not any(q.get_attr("TCA_KIND") == "htb" and q["handle"] == ROOT for q in qdiscs):
        return None
    drops = sum(_drops(q) for q in qdiscs if q.get_attr("TCA_KIND") in FIFO_KINDS.values())
    classes = ipr.get_classes(index=found[0])
    parents = {c["parent"] for c in classes} | {q["parent"] for q in qdiscs}
    return drops + sum(_drops(c) for c in classes if c["handle"] not in parents)


def _drops(msg: Any) -> int:
    stats = msg.get_attr("TCA_STATS2")
    queue = stats.get_attr("TCA_STATS_QUEUE") if stats is not None else None
    return int(queue["drops"]) if queue is not None else 0


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


def apply_priorities(classes: list[PrioClass], ipr: "IPRoute", ifname: str) -> None:
    """Add (replace) the priority classes under 1:1 of `ifname`, whose HTB tree
    `apply` built. Re-applying is harmless."""
    index = ipr.link_lookup(ifname=ifname)[0]
    for cls in classes:
        ipr.tc("replace-class", "htb", index, cls.classid, parent=LINK_CLASS,
               rate=f"{cls.rate_bit}bit", ceil=f"{cls.ceil_bit}bit", prio=cls.prio,
               burst=cls.burst_bytes, cburst=cls.cburst_bytes, quantum=cls.quantum_bytes)
        if cls.queue is not None:
            apply_queue(cls.queue, ipr, index)


def describe_priorities(classes: list[PrioClass]) -> str:
    queues = {describe_queue(c.queue) for c in classes if c.queue is not None}
    return ", ".join([f"1:{c.classid & 0xFFFF:x} prio {c.prio} rate {c.rate_bit / 1e6:g} "
                      "Mbit/s" for c in classes] + sorted(queues))
