"""The kernel receive path of ebpf/rxring.bpf.c: attach, bind messages, read them as numpy.

    ring = rxring.attach("tailcut-quick.ps", "eth0", port=7000, job=wire.job_id("quick"),
                         stride=360)
    m = ring.bind(message, total=64_800, p=0.9)     # before its packets come (at BEGIN)
    for event in ring.poll(timeout_ms=100):         # one at p, one at completion
        msg = ring.message(event.message)
        msg.values, msg.arrived                     # numpy views of the mapped buffer
    ring.release(message)                           # its region may be reused
    ring.detach()

A tc clsact ingress filter (pref FILTER_PRIO, after a loss dropper's pref 1) takes the
job's data datagrams to ``port`` off the stack: each datagram of a bound message is
copied into the message's *region* of a BPF_F_MMAPABLE array and dropped; a message
bound to no region passes to the socket as before. Both memory-mapped maps (the
regions' values, rx_data; their state, rx_regions) are mapped here once, so reading a
message costs no syscall and no copy: ``Message.values`` is a read-only float32 view of
its region, ``Message.arrived`` a read-only bool view of which ranges (packets) were
placed. Compile-time: the stride, ranges per region and regions (-D flags, one image
per combination in bpfcache); run-time: the port, the job (rx_receivers) and each
message's binding (rx_bind, the region's fields).

Ordering: the program copies a range, then sets its bit, its ``arrived`` byte and the
count, then emits the event; x86 keeps stores in order, so what the mask or an event
shows is in the buffer. A region released is reused last (regions are handed out
oldest-free first), which leaves a placement racing the release microseconds on
another CPU where a reuse is many messages away.
"""

from __future__ import annotations

import collections
import contextlib
import mmap
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyroute2 import IPRoute

from tailcut import ebpfheaders
from tailcut.datapath import bcc, bpfcache, clsact
from tailcut.errors import DatapathError
from tailcut.net import netns
from tailcut.spec import fraction

STEM = "rxring"
FUNCTION = "tailcut_rxring"   # the name bpftool and tc show
RECEIVERS_MAP = "rx_receivers"
BIND_MAP = "rx_bind"
REGIONS_MAP = "rx_regions"
DATA_MAP = "rx_data"
EVENTS_MAP = "rx_events"
STATS_MAP = "rx_stats"
# After a loss dropper on the same hook (pref 1), so loss stays per wire packet; the
# ToR programs use 2 to 4 on rack ports, not on a pod's interface.
FILTER_PRIO = 8
FILTER_HANDLE = 1
HEADER = bcc.EBPF_DIR / f"{STEM}.h"
_CONSTS = ebpfheaders.defines(HEADER, "TAILCUT_RX_")
EV_P = _CONSTS["TAILCUT_RX_EV_P"]
EV_COMPLETE = _CONSTS["TAILCUT_RX_EV_COMPLETE"]
MAX_RANGES = _CONSTS["TAILCUT_RX_MAX_RANGES"]
MAX_REGIONS = _CONSTS["TAILCUT_RX_MAX_REGIONS"]
MAX_STRIDE = 4096   # as partial.MAX_STRIDE: a 9000-byte MTU's 2235 with room
MAX_BUFFER_BYTES = 1 << 30   # rx_data's size at most
KINDS = (2, 3)      # tailcut.transports.base.Kind PUSH, PARAMS (the program's check)
# Passed on to the socket: another job's, a message bound to no region, and one that
# is not the bound message's kind or total (a binding made ahead of its BEGIN guessed).
_PASSING = ("unknown_job", "unbound", "kind_mismatch", "total_mismatch", "foreign_source")
# Dropped, though not malformed: a datagram to pass on after placed ones in its skb.
_SPLIT = ("pass_split",)
# A released region is bound again only this long after: a placement that checked the
# old binding before the release, and stalled (an interrupt, a preempted vCPU), lands
# in the old message's region, not in the next one's.
QUARANTINE_S = 0.002


def reasons() -> list[str]:
    """The verdict counter names of enum tailcut_rx_reason, in index order."""
    return ebpfheaders.enum_names(HEADER, "tailcut_rx_reason", "TAILCUT_RX_")


def malformed() -> list[str]:
    """The reasons under which a datagram is dropped without a write."""
    return [r for r in reasons() if r not in ("placed", "duplicate", *_PASSING, *_SPLIT)]


threshold_elements = fraction.threshold_elements  # as the XDP counter computes it


def compile_program(stride: int, ranges: int = 256, regions: int = 32
                    ) -> bpfcache.CachedProgram:
    """Compile (once per machine and combination) and load the program: regions of
    `ranges` packets of `stride` elements each, `regions` of them. No receiver served."""
    if not 1 <= stride <= MAX_STRIDE:
        raise ValueError(f"stride={stride}: elements per packet must be in 1..{MAX_STRIDE}")
    if ranges % 64 or not 64 <= ranges <= MAX_RANGES:
        raise ValueError(f"ranges={ranges}: packets per region must be a multiple of 64 "
                         f"in 64..{MAX_RANGES}")
    if not 1 <= regions <= MAX_REGIONS:
        raise ValueError(f"regions={regions}: must be in 1..{MAX_REGIONS}")
    buffer = regions * ranges * 4 * (stride + stride % 2)
    if buffer > MAX_BUFFER_BYTES:
        raise ValueError(f"regions={regions} x ranges={ranges} x stride={stride}: "
                         f"{buffer >> 20} MiB of buffer, more than {MAX_BUFFER_BYTES >> 20} "
                         "MiB (it is locked kernel memory, charged to the pod)")
    return bpfcache.load(STEM, {FUNCTION: "sched_cls"},
                         cflags=[f"-DTAILCUT_RX_STRIDE={stride}",
                                 f"-DTAILCUT_RX_RANGES={ranges}",
                                 f"-DTAILCUT_RX_REGIONS={regions}"])


def serve(program: bpfcache.CachedProgram, *, port: int, job: int) -> None:
    """Take `job`'s datagrams to UDP `port` from the next packet on."""
    if not 1 <= port <= 65535:
        raise ValueError(f"port={port}: must be in 1..65535")
    if not 0 <= job < 2**32:
        raise ValueError(f"job={job}: must be a 32-bit id (wire.job_id(name))")
    table = program.table(RECEIVERS_MAP)
    table[table.Key(port)] = table.Leaf(job, 1)


def stop_serving(program: bpfcache.CachedProgram, port: int) -> None:
    table = program.table(RECEIVERS_MAP)
    table[table.Key(port)] = table.Leaf(0, 0)


@dataclass(frozen=True)
class Event:
    """A bound message reached its threshold (EV_P in ``what``), or completed
    (EV_COMPLETE), at the receiving interface."""

    job: int
    message: int
    port: int
    region: int
    counted: int
    total: int
    what: int
    seq: int
    ktime_ns: int   # CLOCK_MONOTONIC, as time.monotonic_ns() reads it

    @property
    def at_p(self) -> bool:
        return bool(self.what & EV_P)

    @property
    def complete(self) -> bool:
        return bool(self.what & EV_COMPLETE)


class Message:
    """One bound message: its values and mask as read-only views of the mapped
    buffer (no copy; they change as datagrams arrive, and belong to the next message
    bound to the region once released: copy what must outlive release())."""

    def __init__(self, ring: Ring, message: int, region: int, total: int) -> None:
        self.message = message
        self.region = region
        self.total = total
        self.ranges = -(-total // ring.stride)
        self._stride = ring.stride
        self._state = ring._state[region:region + 1]   # a one-record view (writable)
        rows = ring._data[region, :self.ranges, :ring.stride]
        rows.flags.writeable = False
        self.rows = rows   # rows[i]: range i's elements (the last row's tail unused)
        self._flat: np.ndarray | None = None
        if ring._data.shape[2] == ring.stride:   # an even stride: one flat vector
            flat = ring._data[region].reshape(-1)[:total]
            flat.flags.writeable = False
            self._flat = flat
        arrived = ring._state["arrived"][region, :self.ranges].view(np.bool_)
        arrived.flags.writeable = False
        self.arrived = arrived   # arrived[i]: range i (elements i*stride...) placed

    def __repr__(self) -> str:
        return f"Message({self.message:#x} region {self.region} {self.counted}/{self.total})"

    @property
    def values(self) -> np.ndarray:
        """The message's vector: a view with an even stride (360 for a 1500-byte MTU);
        with an odd one each range is padded by a float, and this is a copy as of now
        (``rows`` is the view)."""
        if self._flat is not None:
            return self._flat
        return self.rows.reshape(-1)[:self.total]

    @property
    def counted(self) -> int:
        """Distinct elements placed so far."""
        return int(self._state["counted"][0])

    @property
    def packets(self) -> int:
        return int(self._state["packets"][0])

    @property
    def duplicates(self) -> int:
        return int(self._state["duplicates"][0])

    @property
    def fired(self) -> int:
        """The EV_* bits the program has emitted for this message."""
        return int(self._state["fired"][0])

    @property
    def complete(self) -> bool:
        return self.counted == self.total

    def lower_threshold(self, threshold: int) -> None:
        """Fire at p when the region itself has `threshold` elements (the rest of the
        message's p came another way: read by the socket before it was bound). If the
        region is short of it, the event may fire again (it may have fired at a
        threshold that counted ranges the socket brought too)."""
        threshold = max(1, min(threshold, self.total))
        self._state["threshold"][0] = threshold
        if self.counted < threshold:
            self._state["fired"][0] &= np.uint64(~EV_P & 0xFFFF_FFFF_FFFF_FFFF)

    def silence(self) -> None:
        """No more events of this message (it was handed over; its region stays bound
        a little, so that its late datagrams are taken here, not by the socket)."""
        self._state["fired"][0] = EV_P | EV_COMPLETE

    def element_mask(self) -> np.ndarray:
        """A bool per element (a copy: the view is per range)."""
        return np.repeat(self.arrived, self._stride)[:self.total]


def _mapped(table: bpfcache.Table, writable: bool) -> mmap.mmap:
    """A shared mapping of a BPF_F_MMAPABLE array's values, element 0 at offset 0."""
    spec = table.spec
    stride = (spec.value_size + 7) & ~7
    length = -(-spec.max_entries * stride // mmap.PAGESIZE) * mmap.PAGESIZE
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    try:
        return mmap.mmap(table.map_fd, length, mmap.MAP_SHARED, prot, offset=0)
    except OSError as err:
        raise DatapathError(f"cannot map {spec.name} ({length} bytes): {err}") from err


class Ring:
    """The program on one interface's ingress, serving one port: regions, bindings,
    events and verdict counters."""

    def __init__(self, program: bpfcache.CachedProgram, port: int, job: int,
                 stride: int) -> None:
        self.program = program
        # Where the filter is (attach() sets them); None: loaded only, as a test runs it.
        self.netns: str | None = None
        self._home: int | None = None   # the namespace it went on, if the caller's own
        self.ifname = ""
        self.ifindex = 0
        self.port = port
        self.job = job
        self.stride = stride
        self.prog_id = program.prog_id(FUNCTION)
        self._open = True
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._reasons = reasons()
        regions = program.table(REGIONS_MAP)
        data = program.table(DATA_MAP)
        self.regions = regions.spec.max_entries
        self._bind = program.table(BIND_MAP)
        state_type = np.dtype(regions.Leaf)
        if state_type.itemsize != regions.spec.value_size or state_type.itemsize % 8:
            raise DatapathError(f"{REGIONS_MAP}: numpy reads {state_type.itemsize}-byte "
                                f"records, the map holds {regions.spec.value_size}")
        self._state_map = _mapped(regions, writable=True)
        self._data_map = _mapped(data, writable=True)
        self._state = np.ndarray((self.regions,), state_type, self._state_map)
        self.ranges = int(self._state["arrived"].shape[1])
        self.capacity = self.ranges * stride   # elements a region holds
        row = data.spec.value_size // 4        # a range's floats, padded to 8 bytes
        if data.spec.max_entries != self.regions * self.ranges or row != stride + stride % 2:
            raise DatapathError(f"{DATA_MAP}: {data.spec.max_entries} ranges of {row} "
                                f"floats, expected {self.regions} x {self.ranges} of "
                                f"{stride}")
        self._data = np.ndarray((self.regions, self.ranges, row), np.float32,
                                self._data_map)
        # Read-only views of every region, for checks that nothing was written outside
        # one (the fuzz tests) and for tools.
        self.data = self._data.view()
        self.data.flags.writeable = False
        self.state = self._state.view()
        self.state.flags.writeable = False
        # (when released, region), oldest first
        self._free: collections.deque[tuple[float, int]] = collections.deque(
            (0.0, r) for r in range(self.regions))
        self._bound: dict[int, Message] = {}
        self._generation = 0
        events = program.table(EVENTS_MAP)
        events.open_ring_buffer(self._on_event)
        self._ring = events

    def __repr__(self) -> str:
        return (f"Ring({self.netns}:{self.ifname} ingress port {self.port} "
                f"prog_id={self.prog_id} {len(self._bound)}/{self.regions} bound)")

    def _on_event(self, _ctx: Any, data: Any, _size: int) -> None:
        e = self._ring.event(data)
        self._events.append(Event(int(e.job), int(e.message), int(e.port), int(e.region),
                                  int(e.counted), int(e.total), int(e.what), int(e.seq),
                                  int(e.ktime_ns)))

    def bind(self, message: int, total: int, p: float, kind: int = KINDS[0],
             zeroed: bool = True, source: int = 0) -> Message:
        """Give `message` (`total` elements) a region, from now on: its datagrams are
        placed there and it fires at ceil(p * total) elements and at completion.
        `zeroed`: its values start at 0; False leaves the last message's where no
        datagram lands (a reader that takes only what ``arrived`` marks saves a pass
        over the region). `source`: the peer's IPv4 address (as an int, host order:
        batch.ipv4); a datagram from elsewhere passes to the socket. 0: any."""
        if not 1 <= total <= self.capacity:
            raise ValueError(f"total={total}: a region holds 1..{self.capacity} elements "
                             f"({self.ranges} ranges of {self.stride}); compile with more "
                             "ranges")
        if kind not in KINDS:
            raise ValueError(f"kind={kind}: a data message is PUSH (2) or PARAMS (3)")
        if not 0 <= message < 2**32:
            raise ValueError(f"message={message}: must be a 32-bit id")
        threshold = threshold_elements(p, total)
        with self._lock:
            if message in self._bound:
                raise DatapathError(f"message {message:#x} is bound already; release it "
                                    "first")
            if not self._free:
                raise DatapathError(f"all {self.regions} regions are bound; release one "
                                    "or compile with more regions")
            if self._free[0][0] > time.monotonic() - QUARANTINE_S:
                raise DatapathError(f"no region has been free for {QUARANTINE_S * 1e3:g} "
                                    "ms yet")
            region = self._free.popleft()[1]
            self._generation += 1
            st = self._state[region:region + 1]
            st["armed"] = 0
            st["counted"] = st["packets"] = st["duplicates"] = st["fired"] = 0
            st["last_ns"] = 0
            st["bits"] = 0
            st["arrived"] = 0
            if zeroed:
                self._data[region, :-(-total // self.stride)] = 0
            st["job"], st["message"], st["port"] = self.job, message, self.port
            st["kind"], st["total"], st["threshold"] = kind, total, threshold
            st["source"] = int.from_bytes(source.to_bytes(4, "big"), sys.byteorder)
            st["armed"] = self._generation   # last: the binding below makes it live
            self._bind[self._bind.Key(self.job, message, self.port)] = \
                self._bind.Leaf(region)
            m = self._bound[message] = Message(self, message, region, total)
            return m

    def message(self, message: int) -> Message:
        """A bound message (KeyError if not bound)."""
        return self._bound[message]

    def release(self, message: int) -> None:
        """Unbind `message`: its later datagrams pass to the socket, its region goes to
        the back of the free list. Views of it read the next message's data once the
        region is bound again."""
        with self._lock:
            m = self._bound.pop(message, None)
            if m is None:
                return
            try:
                del self._bind[self._bind.Key(self.job, message, self.port)]
            except KeyError:
                pass
            self._state["armed"][m.region] = 0
            self._free.append((time.monotonic(), m.region))

    def bound(self) -> list[int]:
        return list(self._bound)

    def poll(self, timeout_ms: int = 100) -> list[Event]:
        """Events that arrived, waiting up to ``timeout_ms`` for the first one."""
        self.program.ring_buffer_poll(timeout_ms)
        events, self._events = self._events, []
        return events

    def consume(self) -> list[Event]:
        """Events that arrived, without waiting."""
        self.program.ring_buffer_consume()
        events, self._events = self._events, []
        return events

    def fileno(self) -> int:
        """The event ring's fd: poll(2) says POLLIN while an event waits."""
        return int(self._ring.map_fd)

    def taken(self) -> int:
        """Datagrams the program took off the stack so far (placed or duplicate)."""
        table = self.program.table(STATS_MAP)
        return sum(int(v) for i in (self._reasons.index("placed"),
                                    self._reasons.index("duplicate"))
                   for v in table[table.Key(i)])

    def stats(self) -> dict[str, int]:
        """Datagrams to the port by verdict since load, summed over CPUs."""
        table = self.program.table(STATS_MAP)
        return {name: sum(int(v) for v in table[table.Key(i)])
                for i, name in enumerate(self._reasons)}

    def detach(self) -> None:
        """Remove the filter (and the clsact if this process added it and it is now
        unused), unmap and close. Harmless twice, and after the namespace is gone."""
        if not self._open:
            return
        self._open = False
        try:
            if self.netns is not None:
                with (netns.entered_fd(self._home) if self._home is not None
                      else contextlib.nullcontext()):
                    clsact.remove_filter(self.netns, self.ifname, self.ifindex,
                                         direction="ingress", prio=FILTER_PRIO,
                                         handle=FILTER_HANDLE, what="rxring")
        finally:
            if self._home is not None:
                os.close(self._home)
                self._home = None
            self._bound.clear()
            for mapped in (self._state_map, self._data_map):
                try:
                    mapped.close()
                except BufferError:
                    pass   # a view is still held: unmapped when the last one goes
            self.program.close()

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()


def load(*, port: int, job: int, stride: int, ranges: int = 256,
         regions: int = 32) -> Ring:
    """Load the program serving `job`'s datagrams to `port`, attached nowhere (attach()
    puts it on an interface; a test runs it with BPF_PROG_TEST_RUN)."""
    program = compile_program(stride, ranges, regions)
    try:
        serve(program, port=port, job=job)
        return Ring(program, port, job, stride)
    except BaseException:
        program.close()
        raise


def attach(netns_name: str, ifname: str, *, port: int, job: int, stride: int,
           ranges: int = 256, regions: int = 32) -> Ring:
    """Load the program serving `job`'s datagrams to `port` and put it on the clsact
    ingress hook of `ifname` in namespace `netns_name` (clsact.HERE: the calling
    thread's own, as a receiving role in its pod attaches)."""
    ring = load(port=port, job=job, stride=stride, ranges=ranges, regions=regions)
    if netns_name == clsact.HERE:   # detach() may run on another thread, elsewhere
        ring._home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        with (IPRoute() if netns_name == clsact.HERE else netns.ipr(netns_name)) as ipr:
            index = clsact.ifindex(ipr, netns_name, ifname)
            clsact.add_filter(ipr, netns_name, ifname, index, direction="ingress",
                              prio=FILTER_PRIO, handle=FILTER_HANDLE,
                              fd=ring.program.fds[FUNCTION], name=FUNCTION, classid=0,
                              what="rxring")
    except BaseException:
        ring.detach()
        raise
    ring.netns, ring.ifname, ring.ifindex = netns_name, ifname, index
    return ring
