"""Apply tailcut.net.shaping's plans to interfaces: the qdiscs and classes through
pyroute2, the eBPF dropper of a Drop op. The plans stay in shaping, which imports
nothing privileged, so that the operator and the manifests can plan links without
netlink (and tailcut.plan without BCC).

    ops = shaping.plan(link, has_netem, "spec.network.uplink")
    attached = tc.apply(ops, ipr, netns_name, ifname, droppers=dropper)

The dropper is tailcut.datapath.dropper, a layer above this one (the import-linter
layers in pyproject.toml): net never imports it, its caller passes it in (`droppers`,
anything that is a `Droppers`), and a Drop op without one is refused.
"""

import struct
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal, Optional, Protocol

from pyroute2.netlink.rtnl import tcmsg
from pyroute2.netlink.rtnl.tcmsg import sched_pfifo

from tailcut.errors import NetError
from tailcut.net import rtnl
from tailcut.net.shaping import (DEFAULT_CLASS, FIFO_KINDS, LINK_CLASS, NETEM_HANDLE, ROOT,
                                 Drop, Htb, Netem, Op, PrioClass, Queue)

if TYPE_CHECKING:
    from pyroute2 import IPRoute

# pyroute2 0.9 knows pfifo's options but not bfifo's; both are the kernel's struct
# tc_fifo_qopt (one u32 limit, include/uapi/linux/pkt_sched.h), so bfifo borrows them.
tcmsg.plugins.setdefault("bfifo", sched_pfifo)

Direction = Literal["egress", "ingress"]


class Droppers(Protocol):
    """What attaches the eBPF dropper of a Drop op: the module tailcut.datapath.dropper,
    passed down by the layer above (the runtime, the node agent, a test)."""

    def attach(self, netns_name: str, ifname: str, loss: float) -> object:
        """Drop each packet leaving `ifname` of `netns_name` with probability `loss`."""

    def attach_in_batch(self, batch: rtnl.Batch, netns_name: str, ifname: str,
                        index: int, loss: float, direction: Direction) -> object:
        """`attach`, as requests added to `batch` for an interface just created."""


def _need(droppers: Optional[Droppers], ops: list[Op], where: str) -> Droppers:
    if droppers is None:
        loss = next(op.loss for op in ops if isinstance(op, Drop))
        raise NetError(f"{where}: loss {loss:g} needs the eBPF dropper, and none was "
                       "given: pass droppers=tailcut.datapath.dropper")
    return droppers


def apply(ops: list[Op], ipr: "IPRoute", netns_name: str, ifname: str,
          index: Optional[int] = None, droppers: Optional[Droppers] = None) -> list[object]:
    """Apply `ops` to the egress of `ifname` (or interface `index`), using `ipr` bound
    in `netns_name`. Qdiscs and classes are replaced, so re-applying them is harmless;
    an eBPF dropper is attached (by `droppers`, needed only for a Drop op), so detach
    the returned ones (the caller keeps them to read their counters) before applying
    again."""
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
            attached.append(_need(droppers, ops, f"{netns_name}/{ifname}").attach(
                netns_name, ifname, op.loss))
    return attached


def add_requests(batch: rtnl.Batch, ops: list[Op], ifindex: int) -> None:
    """Add to `batch` the qdiscs and classes `apply` would make on interface `ifindex`
    (not the eBPF dropper: attach_droppers). pyroute2 encodes each distinct op list
    once (its HTB rate tables take a millisecond); every interface reuses the bytes
    with its own ifindex."""
    for kind, flags, body in _templates(tuple(ops)):
        batch.raw(kind, flags, body[:4] + struct.pack("=i", ifindex) + body[8:],
                  f"tc on ifindex {ifindex}")


def attach_droppers(ops: list[Op], netns_name: str, ifname: str,
                    droppers: Optional[Droppers]) -> list[object]:
    """The eBPF droppers of `ops` on `ifname`'s egress, as `apply` attaches them."""
    attached: list[object] = []
    for op in ops:
        if isinstance(op, Drop):
            attached.append(_need(droppers, ops, f"{netns_name}/{ifname}").attach(
                netns_name, ifname, op.loss))
    return attached


def add_dropper_requests(batch: rtnl.Batch, ops: list[Op], netns_name: str, ifname: str,
                         ifindex: int, droppers: Optional[Droppers],
                         direction: Direction = "egress") -> list[object]:
    """attach_droppers for an interface just created, as requests added to `batch`
    (the caller sends it, and releases the returned droppers if that fails); on its
    ingress for `wire_end`'s ops."""
    attached: list[object] = []
    for op in ops:
        if isinstance(op, Drop):
            attached.append(_need(droppers, ops, f"{netns_name}/{ifname}").attach_in_batch(
                batch, netns_name, ifname, ifindex, op.loss, direction))
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
