"""The XDP partial-delivery counter of ebpf/partial.bpf.c: attach, read its events, detach.

    c = partial.attach("eth0", port=7000, job=wire.job_id("quick"), p=0.9, stride=360)
    for event in c.poll(timeout_ms=100):   # one per message that crossed p * total
        ...
    c.forget(event.message, event.job)     # done with it: free its bl_messages entry
    c.detach()

Only the stride is compiled in; the port, the job and p are an entry of the program's
bl_receivers map (serve / stop_serving), so one program can serve several receivers
and p can change without a new compile.

attach() works in the calling thread's network namespace (a role process runs in its
pod's), or in ``netns_name`` if given. Mode: "generic" (skb mode) by default, because
native XDP on a veth cuts TCP throughput through it from 14.7 to 4.1 Gbit/s here
(PLATFORM.md) and the transport's control channel and every TCP baseline share the
pod's interface; "native" is there to compare. ``Counter.mode`` says which is in use.
Detaching removes the program from the interface; if the process dies first, the
interface (and the program with it) goes when the runtime removes the pod's namespace.
"""

from __future__ import annotations

import errno
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Literal

from pyroute2 import IPRoute, NetlinkError

from tailcut.datapath import bcc, bpfcache
from tailcut.errors import DatapathError
from tailcut.net import netns
from tailcut.spec import fraction

Mode = Literal["generic", "native"]

STEM = "partial"
FUNCTION = "tailcut_partial"  # the name bpftool shows
MESSAGES_MAP = "bl_messages"
RECEIVERS_MAP = "bl_receivers"
EVENTS_MAP = "bl_events"
STATS_MAP = "bl_stats"
XDP_FLAGS = {"native": 4, "generic": 2}  # XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE
XDP_ATTACHED = {"native": "xdp", "generic": "xdpgeneric"}  # IFLA_XDP_ATTACHED, by pyroute2
_GONE = (errno.ENOENT, errno.ENODEV)
MAX_STRIDE = 4096  # elements per packet the counter compiles for (see compile_program)


def reasons() -> list[str]:
    """The verdict counter names of enum tailcut_bl_reason, in index order ("counted", ...)."""
    text = (bcc.EBPF_DIR / f"{STEM}.h").read_text()
    body = re.search(r"enum\s+tailcut_bl_reason\s*\{(.*?)\}", text, flags=re.S)
    assert body is not None, "ebpf/partial.h declares enum tailcut_bl_reason"
    names = re.findall(r"^\s*TAILCUT_BL_(\w+)", body.group(1), flags=re.M)
    return [n.lower() for n in names if n != "REASONS"]


@dataclass(frozen=True)
class Event:
    """A message crossed p * total at the receiver's interface."""

    job: int
    message: int
    counted: int
    total: int
    seq: int
    slot: int
    ktime_ns: int  # CLOCK_MONOTONIC, as time.monotonic_ns() reads it
    port: int      # the receiver's UDP port


p_ppm = fraction.ppm  # p as the program holds it (0.9 -> 900000), checked


def compile_program(stride: int) -> bpfcache.CachedProgram:
    """Compile and load the counter for packets of `stride` elements, serving no
    receiver yet (serve() adds them; no attach)."""
    # 4096 covers a 9000-byte MTU (2235 floats) with room; 8192 slots of 4096 floats
    # (2^25) and their byte counts stay far inside the program's u32 arithmetic.
    if not 1 <= stride <= MAX_STRIDE:
        raise ValueError(f"stride={stride}: elements per packet must be in 1..{MAX_STRIDE}")
    # Compiled once per stride and machine; each receiver loads the cached image (a few
    # ms, where a BCC compile cost every receiving role ~0.4 s of CPU).
    return bpfcache.load(STEM, {FUNCTION: "xdp"}, cflags=[f"-DTAILCUT_BL_STRIDE={stride}"])


def serve(program: bpfcache.CachedProgram, *, port: int, job: int, p: float) -> None:
    """Count the packets of `job` to UDP `port` and fire at `p`, from the next packet
    on: an entry of the program's bl_receivers map, so changing p or adding a
    receiver needs no new compile."""
    if not 1 <= port <= 65535:
        raise ValueError(f"port={port}: must be in 1..65535")
    if not 0 <= job < 2**32:
        raise ValueError(f"job={job}: must be a 32-bit id (wire.job_id(name))")
    table = program.table(RECEIVERS_MAP)
    table[table.Key(port)] = table.Leaf(job, p_ppm(p))


def stop_serving(program: bpfcache.CachedProgram, port: int) -> None:
    """Stop looking at packets to `port`; its messages' entries are freed too."""
    table = program.table(RECEIVERS_MAP)
    table[table.Key(port)] = table.Leaf(0, 0)   # p_ppm 0: not served
    messages = program.table(MESSAGES_MAP)
    for key in [k for k in messages.keys() if int(k.port) == port]:
        try:
            del messages[key]
        except KeyError:
            pass


def load(*, port: int, job: int, p: float, stride: int) -> bpfcache.CachedProgram:
    """Compile and load the counter serving one receiver (no attach)."""
    program = compile_program(stride)
    try:
        serve(program, port=port, job=job, p=p)
    except BaseException:
        program.close()
        raise
    return program


class Counter:
    """The counter attached to one interface; events, per-message state and verdicts."""

    def __init__(self, program: bpfcache.CachedProgram, ns_fd: int, ifname: str, ifindex: int,
                 mode: Mode, netns_name: str | None, port: int) -> None:
        self.program = program
        self.port = port   # the receiver it serves (serve() may add others)
        # The namespace the counter was attached in, held open: detach() may run in
        # another thread, in another namespace (pyroute2 binds netlink per thread).
        self._ns_fd = ns_fd
        self.ifname = ifname
        self.ifindex = ifindex
        self.mode = mode
        self.netns = netns_name
        self.prog_id = program.prog_id(FUNCTION)
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self._attached = True
        self._reasons = reasons()
        table = program.table(EVENTS_MAP)
        table.open_ring_buffer(self._on_event)
        self._ring = table

    def __repr__(self) -> str:
        return (f"Counter({self.netns or 'this netns'}:{self.ifname} {self.mode} "
                f"prog_id={self.prog_id})")

    def _on_event(self, _ctx: Any, data: Any, _size: int) -> None:
        e = self._ring.event(data)
        self._events.append(Event(int(e.job), int(e.message), int(e.counted), int(e.total),
                                  int(e.seq), int(e.slot), int(e.ktime_ns), int(e.port)))

    def poll(self, timeout_ms: int = 100) -> list[Event]:
        """Events that arrived, waiting up to ``timeout_ms`` for the first one."""
        with self._lock:
            self.program.bpf.ring_buffer_poll(timeout_ms)
            events, self._events = self._events, []
        return events

    def consume(self) -> list[Event]:
        """Events that arrived, without waiting: the receive loop calls this after each
        batch it reads (an event is in the ring before its packet reaches the socket)."""
        with self._lock:
            self.program.bpf.ring_buffer_consume()
            events, self._events = self._events, []
        return events

    def fileno(self) -> int:
        """The event ring's file descriptor: poll(2) says POLLIN while an event waits."""
        return int(self._ring.map_fd)

    def state(self, message: int, job: int) -> dict[str, int] | None:
        """The program's record of a message (counted, packets, duplicates, ...), or None."""
        table = self.program.table(MESSAGES_MAP)
        try:
            st = table[table.Key(job, message, self.port)]
        except KeyError:
            return None
        slots = sum(bin(int(w)).count("1") for w in st.slots)
        return {"total": int(st.total), "threshold": int(st.threshold),
                "counted": int(st.counted), "packets": int(st.packets),
                "duplicates": int(st.duplicates), "fired": int(st.fired),
                "slots_set": slots}

    def messages(self) -> list[int]:
        """Message ids the program is tracking for this counter's port."""
        return [int(k.message) for k in self.program.table(MESSAGES_MAP).keys()
                if int(k.port) == self.port]

    def forget(self, message: int, job: int) -> None:
        """Free a message's entry (the transport is done with it)."""
        table = self.program.table(MESSAGES_MAP)
        try:
            del table[table.Key(job, message, self.port)]
        except KeyError:
            pass

    def stats(self) -> dict[str, int]:
        """Packets to the port by verdict since attach, summed over CPUs."""
        table = self.program.table(STATS_MAP)
        return {name: sum(int(v) for v in table[table.Key(i)])
                for i, name in enumerate(self._reasons)}

    def detach(self) -> None:
        """Remove the program from the interface and close it. Harmless twice, and after
        the namespace or interface is gone."""
        if not self._attached:
            return
        self._attached = False
        try:
            with netns.entered_fd(self._ns_fd), IPRoute() as ipr:
                _set_xdp(ipr, self.ifindex, -1, self.mode)
        except NetlinkError as err:
            if err.code not in _GONE:  # gone with its namespace: nothing left to detach
                raise DatapathError(f"cannot detach XDP from {self.ifname}: {err}") from err
        finally:
            os.close(self._ns_fd)
            self.program.close()

    def __enter__(self) -> Counter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()


def _namespace_fd(netns_name: str | None) -> int:
    """An open fd of ``netns_name``, or of the calling thread's namespace."""
    if netns_name is None:
        return os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        return netns.enter_fd(netns_name)
    except FileNotFoundError as err:
        raise DatapathError(f"network namespace {netns_name} does not exist") from err


def _set_xdp(ipr: IPRoute, index: int, fd: int, mode: Mode) -> None:
    ipr.link("set", index=index, xdp={"attrs": [("IFLA_XDP_FD", fd),
                                                ("IFLA_XDP_FLAGS", XDP_FLAGS[mode])]})


def attach(ifname: str, *, port: int, job: int, p: float, stride: int,
           mode: Mode = "generic", netns_name: str | None = None) -> Counter:
    """Load the counter and attach it to ``ifname`` in XDP ``mode``."""
    if mode not in XDP_FLAGS:
        raise ValueError(f"mode={mode!r}: must be one of {sorted(XDP_FLAGS)}")
    program = load(port=port, job=job, p=p, stride=stride)
    ns_fd = -1
    try:
        ns_fd = _namespace_fd(netns_name)
        with netns.entered_fd(ns_fd), IPRoute() as ipr:
            found = ipr.link_lookup(ifname=ifname)
            if not found:
                raise DatapathError(f"no interface {ifname} in "
                                    f"{netns_name or 'this network namespace'}")
            index = int(found[0])
            if ipr.get_links(index)[0].get_nested("IFLA_XDP", "IFLA_XDP_ATTACHED"):
                raise DatapathError(f"{ifname} already has an XDP program; detach it first "
                                    "(one bounded-loss receiver per interface)")
            try:
                _set_xdp(ipr, index, program.fds[FUNCTION], mode)
            except NetlinkError as err:
                raise DatapathError(f"cannot attach XDP to {ifname} in {mode} mode: {err} "
                                    "(`tailcut doctor` says which modes work)") from err
            got = ipr.get_links(index)[0].get_nested("IFLA_XDP", "IFLA_XDP_ATTACHED")
            if got != XDP_ATTACHED[mode]:
                _set_xdp(ipr, index, -1, mode)
                raise DatapathError(f"asked for {mode} XDP on {ifname}; the kernel reports "
                                    f"{got}")
        return Counter(program, ns_fd, ifname, index, mode, netns_name, port)
    except BaseException:
        if ns_fd >= 0:
            os.close(ns_fd)
        program.close()
        raise
