"""Kernel feature probes: one cached function per feature, each trying the thing for real.

Each probe tries the thing itself (adds the qdisc, loads the program, attaches XDP) in a
scratch namespace `tailcut-doctor.<pid>` holding one veth pair, removed before the probe
returns; the kernel's refusal is read from its errno, never from a tool's text. Results
are cached per process, so the runtime can ask `features.netem().available` before each
job for free. `Feature.require()` turns a missing feature into KernelFeatureMissing.
"""

import errno
import functools
import importlib
import os
import platform
import resource
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pyroute2 import IPRoute, NetlinkError

from tailcut.datapath import bcc as bcc_loader
from tailcut.datapath import bpfsys, dropper
from tailcut.errors import DatapathError, KernelFeatureMissing
from tailcut.net import netns

SCRATCH_PREFIX = "tailcut-doctor."
_VETH = "probe0"
# Errnos by which the kernel says "I have no such qdisc / classifier / program type /
# mode". Anything else is a failure of the probe, not an answer, and is raised.
_ABSENT = {errno.ENOENT, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS}
XDP_FLAGS = {"native": 4, "generic": 2}  # XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE
XDP_MODES = {"native": "xdp", "generic": "xdpgeneric"}  # IFLA_XDP_ATTACHED as named by pyroute2


@dataclass(frozen=True)
class Feature:
    """One probed feature: is it there, what the probe saw, what that means for a job."""

    name: str
    available: bool
    detail: str
    meaning: str
    probed: bool = True   # False: not tried (it needs root), so `available` is unknown

    def require(self) -> None:
        """Raise KernelFeatureMissing if this feature is missing."""
        if not self.available:
            raise KernelFeatureMissing(f"{self.name} is missing ({self.detail}): "
                                       f"{self.meaning}")


T = TypeVar("T")


class _AbsentError(Exception):
    """Raised inside a probe when the kernel refused the feature; says how."""


def _refused(what: str, call: Callable[[], T], why: dict[int, str] | None = None) -> T:
    """Run one netlink or bpf(2) call of a probe. An errno in _ABSENT becomes
    _AbsentError, explained by `why` if it knows that errno; any other error propagates,
    because it means the probe itself broke."""
    try:
        return call()
    except (NetlinkError, OSError) as err:
        code = int(err.code if isinstance(err, NetlinkError) else err.errno or 0)
        if code not in _ABSENT:
            raise
        reason = (why or {}).get(code)
        raise _AbsentError(f"{what} failed with {errno.errorcode.get(code, code)}"
                           + (f": {reason}" if reason else "")) from err


def _probe(name: str, body: Callable[[], str], yes: str, no: str,
           needs_root: bool = True) -> Feature:
    """Run `body` (it returns what it saw) and say what the outcome means for a job."""
    if needs_root and os.geteuid() != 0:
        return Feature(name, False, "not probed: needs root", no, probed=False)
    try:
        return Feature(name, True, body(), yes)
    except _AbsentError as absent:
        return Feature(name, False, str(absent), no)


_scratch_lock = threading.Lock()  # one scratch namespace name per process


@contextmanager
def _scratch() -> Iterator[tuple[IPRoute, int]]:
    """A fresh namespace holding a veth pair; yields a netlink socket inside it and the
    index of one end. The namespace, and with it the veth, is removed afterwards."""
    name = f"{SCRATCH_PREFIX}{os.getpid()}"
    with _scratch_lock:
        netns.create(name)
        try:
            with netns.ipr(name) as ipr:
                ipr.link("add", ifname=_VETH, kind="veth", peer=f"{_VETH}p")
                yield ipr, int(ipr.link_lookup(ifname=_VETH)[0])
        finally:
            netns.remove(name)


@contextmanager
def _program(prog_type: int, value: int, kind: str) -> Iterator[int]:
    """The fd of a loaded program that only returns `value`; closed afterwards."""
    fd = _refused(f"loading a {kind} program",
                  lambda: bpfsys.load_return(prog_type, value, "tailcut_probe"))
    try:
        yield fd
    finally:
        os.close(fd)


@functools.cache
def root() -> Feature:
    uid = os.geteuid()
    return Feature("root", uid == 0, f"euid {uid}",
                   "namespaces, shaping and BPF programs can be set up" if uid == 0 else
                   "no job can run: building namespaces and loading BPF need root")


def _qdisc(kind: str, yes: str, no: str, **options: object) -> Feature:
    def body() -> str:
        with _scratch() as (ipr, index):
            _refused(f"adding a {kind} qdisc to a veth",
                     lambda: ipr.tc("add", kind, index, handle="1:", **options),
                     {errno.ENOENT: f"the kernel has no {kind} qdisc"})
        return f"added a {kind} qdisc to a veth"
    return _probe(kind, body, yes, no)


@functools.cache
def netem() -> Feature:
    return _qdisc("netem", "delay, jitter and the loss towards a pod or on an uplink are "
                  "applied by netem (a pod's own direction always loses at the eBPF dropper)",
                  "loss falls back to the eBPF dropper; delay and jitter are refused")


@functools.cache
def htb() -> Feature:
    return _qdisc("htb", "link rates and flow priority classes are enforced by HTB",
                  "jobs that set a link rate or flow priorities are refused",
                  default=0x10)


@functools.cache
def clsact_bpf() -> Feature:
    def body() -> str:
        with _program(bpfsys.BPF_PROG_TYPE_SCHED_CLS, bpfsys.TC_ACT_OK, "sched_cls") as fd, \
                _scratch() as (ipr, index):
            _refused("adding a clsact qdisc to a veth",
                     lambda: ipr.tc("add", "clsact", index),
                     {errno.ENOENT: "the kernel has no clsact qdisc"})
            _refused("adding a direct-action bpf filter on clsact egress",
                     lambda: ipr.tc("add-filter", "bpf", index, handle=1, fd=fd,
                                    name="tailcut_probe", parent="ffff:fff3", prio=1,
                                    direct_action=True),
                     {errno.ENOENT: "the kernel has no bpf classifier"})
        return "added a clsact qdisc and a direct-action bpf filter to a veth"
    return _probe("clsact_bpf", body,
                  "the loss dropper and the flow-tag classifier can run at tc",
                  "no loss on a pod's own direction (loss elsewhere needs netem), and flow "
                  "tags cannot be mapped to priority classes")


def _xdp(mode: str, yes: str, no: str) -> Feature:
    def body() -> str:
        with _program(bpfsys.BPF_PROG_TYPE_XDP, bpfsys.XDP_PASS, "XDP") as fd, \
                _scratch() as (ipr, index):
            xdp = {"attrs": [("IFLA_XDP_FD", fd), ("IFLA_XDP_FLAGS", XDP_FLAGS[mode])]}
            _refused(f"attaching XDP to a veth in {mode} mode",
                     lambda: ipr.link("set", index=index, xdp=xdp))
            got = ipr.get_links(index)[0].get_nested("IFLA_XDP", "IFLA_XDP_ATTACHED")
        if got != XDP_MODES[mode]:
            raise _AbsentError(f"asked for {mode} mode on a veth, the kernel reports {got}")
        return f"attached an XDP program to a veth in {mode} mode ({got})"
    return _probe(f"xdp_{mode}", body, yes, no)


@functools.cache
def xdp_native() -> Feature:
    return _xdp("native",
                "the XDP message counter can run in the veth driver (native mode)",
                "the XDP message counter can only run in generic mode")


@functools.cache
def xdp_generic() -> Feature:
    return _xdp("generic",
                "the XDP message counter can run in generic (skb) mode on any link",
                "the XDP message counter can only run where native mode works")


@functools.cache
def ringbuf() -> Feature:
    def body() -> str:
        size = resource.getpagesize()
        os.close(_refused("creating a BPF ring buffer map",
                          lambda: bpfsys.create_ringbuf(size)))
        return f"created a {size}-byte BPF ring buffer map"
    return _probe("ringbuf", body,
                  "partial-delivery events reach the receiver through a ring buffer",
                  "the bounded-loss transport cannot signal partial delivery")


@functools.cache
def bcc() -> Feature:
    def body() -> str:
        try:
            module = importlib.import_module("bcc")
        except ImportError as err:
            raise _AbsentError(f"import bcc failed ({err}); run scripts/setup.sh") from err
        headers = Path("/lib/modules") / platform.release() / "build"
        if not headers.exists() and not Path("/sys/kernel/kheaders.tar.xz").exists():
            raise _AbsentError(f"no kernel headers: {headers} is missing and the kernel has "
                          "no /sys/kernel/kheaders.tar.xz; run scripts/setup.sh")
        started = time.monotonic()
        try:
            bcc_loader.load(dropper.STEM, {dropper.FUNCTION: "sched_cls"}).close()
        except DatapathError as err:
            raise _AbsentError(str(err).splitlines()[0]) from err
        return (f"bcc {getattr(module, '__version__', '?')}, headers {headers} -> "
                f"{headers.resolve()}; compiled and loaded ebpf/{dropper.STEM}.bpf.c in "
                f"{time.monotonic() - started:.2f} s")
    return _probe("bcc", body,
                  "BPF programs (loss dropper, XDP counter) can be compiled and loaded",
                  "no BPF program can be built: no loss on a pod's own direction (nor "
                  "elsewhere without netem), no bounded-loss transport")


@functools.cache
def vxlan() -> Feature:
    def body() -> str:
        with _scratch() as (ipr, _):
            _refused("adding a VXLAN device",
                     lambda: ipr.link("add", ifname="tcprobevx", kind="vxlan", vxlan_id=1,
                                      vxlan_port=4789, vxlan_learning=0),
                     {errno.EOPNOTSUPP: "the kernel has no vxlan driver"})
        return "added a VXLAN device"
    return _probe("vxlan", body,
                  "on Kubernetes, a job's racks on different nodes are joined by VXLAN",
                  "on Kubernetes, a job whose racks are placed on several nodes cannot "
                  "join them here (the agent fails to build its spine); one node works")


@functools.cache
def bpftool() -> Feature:
    def body() -> str:
        path = shutil.which("bpftool")
        if path is None:
            raise _AbsentError("bpftool is not on PATH")
        done = subprocess.run([path, "version"], capture_output=True, text=True,
                              timeout=10, check=False)
        if done.returncode != 0:
            raise _AbsentError(f"{path} version exited with status {done.returncode}")
        return f"{path}: {done.stdout.splitlines()[0] if done.stdout else '?'}"
    return _probe("bpftool", body,
                  "loaded programs and maps can be inspected (tests use it for leftovers)",
                  "nothing changes for a job; install bpftool to inspect BPF programs",
                  needs_root=False)


ALL: tuple[Callable[[], Feature], ...] = (
    root, netem, htb, clsact_bpf, xdp_native, xdp_generic, ringbuf, bcc, vxlan, bpftool)


def clear_cache() -> None:
    """Forget every cached result (for tests, or after the machine changed)."""
    for probe in ALL:
        probe.cache_clear()  # type: ignore[attr-defined]
