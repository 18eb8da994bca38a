"""Random packet loss on one interface by the tc program ebpf/dropper.bpf.c (no netem here).

    d = dropper.attach("tailcut-quick.worker-0", "eth0", 0.05)   # egress by default
    ...
    passed, dropped = d.counts()     # what was actually applied, for the job's status
    d.detach()

What attach() puts on the interface, inside its namespace, as `tc qdisc show dev eth0`
and `tc filter show dev eth0 egress` show it:

    qdisc clsact ffff: parent ffff:fff1          (added only if absent)
    filter protocol all pref 1 bpf chain 0 handle 0x1 flowid :3
           tailcut_drop:loss=0.05 direct-action ... name tailcut_drop

The root qdisc (HTB, for rates) is untouched: clsact hangs off its own hook, so both
coexist, and on egress a packet meets the dropper before HTB, so a dropped packet
never spends HTB tokens. One program serves every interface and loss: it is compiled
once per machine (bpfcache keeps the image; later runs load it in milliseconds) and
loaded once per process. The filter's classid (":3" above) is the attachment's slot
in the program's maps, which hold each slot's loss and counters (ebpf/dropper.h).
detach() deletes the filter, and the clsact qdisc too if this process added it and
no filter is left on it.
"""

import struct
import threading
from dataclasses import dataclass, field

from tailcut.datapath import bpfcache, clsact
from tailcut.errors import DatapathError
from tailcut.net import netns, rtnl

Direction = clsact.Direction
PARENTS = clsact.PARENTS

STEM = "dropper"
FUNCTION = "tailcut_drop"  # the name bpftool shows; distinctive so leftovers are findable
COUNTS_MAP = "drop_counts"
THRESHOLDS_MAP = "drop_thresholds"

# Preference 1 runs first on its hook, so a classifier added later at a higher
# preference still sees every packet the dropper keeps (it returns TC_ACT_UNSPEC).
FILTER_PRIO = 1
# One dropper per hook of an interface: a second one would compound the loss.
FILTER_HANDLE = 1

_lock = threading.Lock()


@dataclass
class _Shared:
    """The loaded program, which every dropper of this process shares whatever its
    loss, and the slots in use (each slot has its own loss and counters)."""

    program: bpfcache.CachedProgram
    slots: set[int]
    prog_id: int
    next_slot: int = 1   # slots below it were handed out at least once
    # (direction, loss text) -> the attach requests, encoded once (see _requests)
    templates: dict[tuple[str, str], list["_Request"]] = field(default_factory=dict)


_shared: _Shared | None = None


def threshold(loss: float) -> int:
    """The u32 the program compares bpf_get_prandom_u32() against: round(loss * 2^32),
    saturated to 0xffffffff, which the program reads as "drop everything"."""
    return min(round(loss * 2**32), 0xFFFFFFFF)


def _check(loss: float, direction: str) -> None:
    if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not 0 <= loss <= 1:
        raise ValueError(f"loss={loss!r}: must be a fraction in [0, 1] "
                         "(0.05 drops 5% of packets, 0 none, 1 all)")
    if direction not in PARENTS:
        raise ValueError(f"direction={direction!r}: must be one of {sorted(PARENTS)}")


def _acquire(thr: int) -> tuple[_Shared, int]:
    """The program (loaded on first use) and a fresh slot: counters zeroed, its
    threshold `thr`."""
    global _shared
    shared = _shared
    if shared is None:
        program = bpfcache.load(STEM, {FUNCTION: "sched_cls"})
        shared = _shared = _Shared(program, set(), program.prog_id(FUNCTION))
    table = shared.program.table(COUNTS_MAP)
    if shared.next_slot < len(table):   # the common case: a build attaching thousands
        slot: int | None = shared.next_slot
        shared.next_slot += 1
    else:
        slot = next((s for s in range(1, len(table)) if s not in shared.slots), None)
    if slot is None:
        raise DatapathError(f"{len(table) - 1} droppers are attached already; raise "
                            "TAILCUT_DROP_SLOTS in ebpf/dropper.h")
    del table[table.Key(slot)]  # a per-CPU array's entry is zeroed on delete
    thresholds = shared.program.table(THRESHOLDS_MAP)
    thresholds[thresholds.Key(slot)] = thresholds.Leaf(thr)
    shared.slots.add(slot)
    return shared, slot


def _release(slot: int) -> None:
    global _shared
    shared = _shared
    assert shared is not None, "a dropper holds a slot of the loaded program"
    shared.slots.discard(slot)
    if not shared.slots:
        # Closing our fds unloads the program once no filter holds it.
        shared.program.close()
        _shared = None


class AttachedDropper:
    """A dropper on one hook of one interface; counts() tells what it did."""

    def __init__(self, netns_name: str, ifname: str, ifindex: int, direction: Direction,
                 loss: float, slot: int, prog_id: int) -> None:
        self.netns = netns_name
        self.ifname = ifname
        self.ifindex = ifindex
        self.direction = direction
        self.loss = loss
        self.slot = slot
        self.prog_id = prog_id  # for `bpftool prog show id N`; shared by every dropper
        self.threshold = threshold(loss)
        self._final: tuple[int, int] | None = None

    def __repr__(self) -> str:
        return (f"AttachedDropper({self.netns}:{self.ifname} {self.direction} "
                f"loss={self.loss:g} prog_id={self.prog_id} slot={self.slot})")

    def counts(self) -> tuple[int, int]:
        """(passed, dropped) packets since attach, summed over CPUs; after detach,
        the final numbers."""
        if self._final is not None:
            return self._final
        with _lock:
            assert _shared is not None, "an attached dropper holds its program"
            table = _shared.program.table(COUNTS_MAP)
            per_cpu = table[table.Key(self.slot)]
            return (sum(int(c.passed) for c in per_cpu),
                    sum(int(c.dropped) for c in per_cpu))

    def detach(self) -> None:
        """Remove the filter (and clsact if we added it and it is now empty). Harmless
        twice, and after the namespace or interface is gone."""
        if self._final is not None:
            return
        self._final = self.counts()
        try:
            clsact.remove_filter(self.netns, self.ifname, self.ifindex,
                                 direction=self.direction, prio=FILTER_PRIO,
                                 handle=FILTER_HANDLE, what="dropper")
        finally:
            with _lock:
                _release(self.slot)

    def release(self) -> None:
        """Keep the final counts and let go of the program, leaving the filter to go
        with its interface: for a teardown that deletes the link next (one netlink
        request fewer per dropper). Harmless twice, and after detach."""
        if self._final is not None:
            return
        self._final = self.counts()
        with _lock:
            _release(self.slot)

    def __enter__(self) -> "AttachedDropper":
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()


# Sentinels the attach requests are encoded with once, then replaced per attachment.
_SENTINEL_IFINDEX = 0x7ACE0001
_SENTINEL_CLASSID = 0x7ACE0002


@dataclass(frozen=True)
class _Request:
    """One netlink request of an attachment, its variable fields at known offsets."""

    kind: int
    flags: int
    body: bytes        # what follows the netlink header
    ifindex_at: int    # offset in body of the tcmsg's ifindex
    classid_at: int    # offset in body of TCA_BPF_CLASSID's value; -1: none

    def bytes_for(self, index: int, slot: int) -> bytes:
        body = bytearray(self.body)
        struct.pack_into("=i", body, self.ifindex_at, index)
        if self.classid_at >= 0:
            struct.pack_into("=I", body, self.classid_at, slot)
        return bytes(body)


def _requests(shared: _Shared, direction: Direction, loss: float) -> list[_Request]:
    """The clsact and filter requests for `shared`'s program on `direction`, encoded by
    pyroute2 once per program, direction and loss: encoding them for every one of a
    big network's thousands of link ends took most of its lossy build time."""
    key = (direction, f"{loss:g}")
    cached = shared.templates.get(key)
    if cached is not None:
        return cached
    from pyroute2 import IPBatch
    encoder = IPBatch()
    encoder.tc("replace", "clsact", _SENTINEL_IFINDEX)
    encoder.tc("add-filter", "bpf", _SENTINEL_IFINDEX, handle=FILTER_HANDLE,
               parent=clsact.PARENTS[direction], prio=FILTER_PRIO,
               fd=shared.program.fds[FUNCTION], name=f"{FUNCTION}:loss={loss:g}",
               classid=_SENTINEL_CLASSID, direct_action=True)
    data, offset, out = bytes(encoder.batch), 0, []
    classid = struct.pack("=I", _SENTINEL_CLASSID)
    while offset < len(data):
        length, kind, flags = struct.unpack_from("=IHH", data, offset)
        body = data[offset + 16:offset + length]
        # struct tcmsg: family, 3 pad bytes, then ifindex (the UAPI layout).
        assert struct.unpack_from("=i", body, 4)[0] == _SENTINEL_IFINDEX
        assert body.count(classid) <= 1, "the classid sentinel is unambiguous"
        out.append(_Request(kind, flags & ~rtnl.NLM_F_ACK, body, 4, body.find(classid)))
        offset += (length + 3) & ~3
    assert [r.classid_at >= 0 for r in out] == [False, True], "clsact, then the filter"
    shared.templates[key] = out
    return out


def attach_in_batch(batch: "rtnl.Batch", netns_name: str, ifname: str, index: int,
                    loss: float, direction: Direction = "egress") -> AttachedDropper:
    """The requests that attach a dropper to interface `index` (`ifname`) of
    `netns_name`, added to `batch` for the caller to send there: for an interface the
    caller just created, with no clsact and no filter yet (the network builder's, which
    attaches thousands at once). The dropper holds its slot from now on: release it if
    the batch fails."""
    _check(loss, direction)
    thr = threshold(loss)
    with _lock:
        shared, slot = _acquire(thr)
        try:
            requests = _requests(shared, direction, loss)
        except BaseException:
            _release(slot)
            raise
    what = f"the dropper on {ifname} in {netns_name}"
    for request in requests:
        batch.raw(request.kind, request.flags, request.bytes_for(index, slot), what)
    clsact.record_added(netns_name, index)
    return AttachedDropper(netns_name, ifname, index, direction, loss, slot, shared.prog_id)


def attach(netns_name: str, ifname: str, loss: float,
           direction: Direction = "egress") -> AttachedDropper:
    """Drop each packet leaving (or entering) `ifname` in namespace `netns_name` with
    probability `loss` in [0, 1]."""
    _check(loss, direction)
    thr = threshold(loss)
    with _lock:
        shared, slot = _acquire(thr)
    try:
        prog_id = shared.prog_id
        with netns.ipr(netns_name) as ipr:
            index = clsact.ifindex(ipr, netns_name, ifname)
            clsact.add_filter(ipr, netns_name, ifname, index, direction=direction,
                              prio=FILTER_PRIO, handle=FILTER_HANDLE,
                              fd=shared.program.fds[FUNCTION],
                              name=f"{FUNCTION}:loss={loss:g}", classid=slot,
                              what="dropper")
    except BaseException:
        with _lock:
            _release(slot)
        raise
    return AttachedDropper(netns_name, ifname, index, direction, loss, slot, prog_id)
