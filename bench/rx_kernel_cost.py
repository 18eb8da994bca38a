"""CPU per received message: today's receive path against the kernel path (rxring), side by side.

    .venv/bin/python bench/rx_kernel_cost.py [--runs 3] [--messages 400] [--window 4]

One sender process, in its own namespace, sends quickstart-sized messages (259 KB:
180 datagrams, UDP GSO as the transport's sender cuts them, shuffled order) over an
unshaped veth to this process, in the other namespace, which receives them:

- current: a socket with UDP_GRO read by batch.GroInbox and receiver.Receiver.accept
  (the compiled rxfast path where it is built), as the bounded-loss receive thread
  does, with the XDP counter of partial.bpf.c on the interface in generic mode (the
  transport's default; --current-xdp none leaves it off);
- kernel: rxring.bpf.c on the interface's clsact ingress places each datagram in a
  bound message's region and drops it; this process waits on the event ring and, at
  a message's completion event, copies its vector out (what handing it to the
  application costs while regions are reused; --no-copy leaves it out).

Both receive the same stream: the receiver gives the sender a credit (a 4-byte message
id, over the same veth, the other way) per message it is ready for, `--window` at a
time, so nothing is lost and neither path can fall behind. Per message, this
process's CPU (user + system, getrusage) and the host's softirq and irq time from
/proc/stat (where the kernel's receive work, the tc program's included, runs on a
veth) are printed with the ratio current / kernel, and medians over the runs. The
softirq time is the whole host's, in clock ticks (10 ms): other processes' traffic
lands in it too, and a run needs a few hundred messages for it to mean anything. The
sender's CPU is printed too, but not in the ratio. Every figure is marked with the
host's state (bench/hostcheck.py): taken on a busy host it says little.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import select
import socket
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import hostcheck  # noqa: E402
from tailcut.fidelity import hostcpu  # noqa: E402
from tests.datapath.udp_link import Link  # noqa: E402

PORT = 7400          # data, to the receiver
CREDIT_PORT = 7401   # credits, to the sender
JOB_NAME = "rx-kernel-cost"
ELEMENTS = 64_800    # the quickstart mlp's 259 KB
WARMUP = 8           # messages received before the measurement starts
STOP = 0xFFFFFFFF


@dataclass(eq=False)
class Peer:
    peer_id: int = 1
    udp_addr: tuple[str, int] = ("10.99.0.1", 0)


def message_id(i: int) -> int:
    return (1 << 16) | (i & 0xFFFF)


# ---- the sender (run in the sender's namespace as a child: --sender) --------------------


def sender_main(args: argparse.Namespace) -> None:
    """Send one message per credit until a STOP credit, each as the transport does
    (sender.Packets, shuffled, UDP GSO bursts of batch.max_segments datagrams)."""
    from tailcut.transports import batch, sender, wire
    from tailcut.transports.base import Kind
    from tests.datapath.udp_link import RECEIVER_IP, SENDER_IP

    stride = wire.elements_per_packet()
    job = wire.job_id(JOB_NAME)
    per_gso = batch.max_segments(wire.HEADER_BYTES + 4 * stride)
    values = np.random.default_rng(0).standard_normal(ELEMENTS).astype(np.float32)
    rng = np.random.default_rng(1)
    credits = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    credits.bind((SENDER_IP, CREDIT_PORT))
    credits.settimeout(30.0)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    print("ready", flush=True)
    while True:
        (message,) = struct.unpack("=I", credits.recv(4))
        if message == STOP:
            break
        packets = sender.Packets(values, job, message, int(Kind.PUSH), stride)
        order = rng.permutation(len(packets))
        packets.number(order, 0, 0)
        out = packets.batch(tx, order, (RECEIVER_IP, PORT), gso=True)
        for first in range(0, len(order), per_gso):
            out.send(first, min(per_gso, len(order) - first))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"{usage.ru_utime + usage.ru_stime}", flush=True)


# ---- the receiver (this process, in the receiver's namespace for its sockets) -----------


@dataclass
class Cost:
    messages: int
    cpu_s: float          # this process, user + system
    softirq_s: float      # the host's softirq + irq
    switches: int         # this process's context switches
    wall_s: float
    sender_cpu_s: float

    def per_message_us(self) -> float:
        return (self.cpu_s + self.softirq_s) / self.messages * 1e6


class Meter:
    def __init__(self) -> None:
        self.usage = resource.getrusage(resource.RUSAGE_SELF)
        self.host = hostcpu.read()
        self.at = time.monotonic()

    def stop(self, messages: int, sender_cpu_s: float) -> Cost:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        host = hostcpu.read()
        tick = os.sysconf("SC_CLK_TCK")
        soft = sum(host.ticks[k] - self.host.ticks[k] for k in ("softirq", "irq")) / tick
        return Cost(messages, usage.ru_utime + usage.ru_stime - self.usage.ru_utime
                    - self.usage.ru_stime, soft,
                    usage.ru_nvcsw + usage.ru_nivcsw - self.usage.ru_nvcsw
                    - self.usage.ru_nivcsw, time.monotonic() - self.at, sender_cpu_s)


def start_sender(link: Link) -> subprocess.Popen[bytes]:
    from tailcut.runtime import procs
    env = {"PYTHONPATH": str(Path(__file__).resolve().parent.parent),
           "PATH": os.environ.get("PATH", "")}
    child = procs.spawn(link.sender, [sys.executable, __file__, "--sender"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert child.stdout is not None
    if child.stdout.readline().strip() != b"ready":
        _, err = child.communicate(timeout=10)
        raise RuntimeError(f"the sender did not start: {err.decode()[-2000:]}")
    return child


def finish_sender(child: subprocess.Popen[bytes], credit: socket.socket) -> float:
    from tests.datapath.udp_link import SENDER_IP
    credit.sendto(struct.pack("=I", STOP), (SENDER_IP, CREDIT_PORT))
    out, err = child.communicate(timeout=30)
    if child.returncode != 0:
        raise RuntimeError(f"the sender failed: {err.decode()[-2000:]}")
    return float(out.split()[-1])


def run_current(link: Link, messages: int, window: int, xdp: bool) -> Cost:
    from tailcut.datapath import partial
    from tailcut.net import netns
    from tailcut.transports import batch, receiver, wire
    from tailcut.transports.base import Kind
    from tests.datapath.udp_link import IFNAME, RECEIVER_IP, SENDER_IP

    stride = wire.elements_per_packet()
    job = wire.job_id(JOB_NAME)
    ns = link.receiver
    counter = partial.attach(IFNAME, port=PORT, job=job, p=1.0, stride=stride,
                             netns_name=ns) if xdp else None
    with netns.entered(ns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        credit = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, 33, 32 << 20)   # SO_RCVBUFFORCE, as datagram.py
        sock.bind((RECEIVER_IP, PORT))
        sock.setblocking(False)
        r = receiver.Receiver(job, stride, 1.0, True, False, 1 << 26, collections.Counter())
        inbox = batch.GroInbox(sock, 128, r.row_bytes)
        peer = Peer()
        source = batch.ipv4(SENDER_IP)
        r.peers[1] = (peer, source)
        child = start_sender(link)
        waiter = select.poll()
        waiter.register(sock.fileno(), select.POLLIN)

        def ready(i: int) -> None:
            r.begin(peer, source, message_id(i), int(Kind.PUSH), 0, 0, ELEMENTS, 0)
            credit.sendto(struct.pack("=I", message_id(i)), (SENDER_IP, CREDIT_PORT))

        total = WARMUP + messages
        for i in range(min(window, total)):
            ready(i)
        done_count, meter = 0, None
        while done_count < total:
            if not waiter.poll(10_000):
                raise RuntimeError(f"nothing arrived for 10 s after {done_count} messages")
            n = inbox.recv()
            if not n:
                continue
            done: list[receiver.Done] = []
            r.accept(inbox.rows(n), inbox.lengths(n), inbox.sources(n), done, None,
                     inbox.addresses)
            if counter is not None:
                counter.consume()
            for d in done:
                if d.reason != "full":
                    raise RuntimeError(f"message {d.rx} ended as {d.reason}, not full")
                r.rx.pop(d.rx.message, None)
                done_count += 1
                if done_count == WARMUP:
                    meter = Meter()
                if done_count - 1 + window < total:
                    ready(done_count - 1 + window)
        assert meter is not None
        sender_cpu = finish_sender(child, credit)
        return meter.stop(messages, sender_cpu)
    finally:
        sock.close()
        credit.close()
        if counter is not None:
            counter.detach()


def run_kernel(link: Link, messages: int, window: int, copy: bool) -> Cost:
    from tailcut.datapath import rxring
    from tailcut.net import netns
    from tailcut.transports import wire
    from tests.datapath.udp_link import IFNAME, SENDER_IP

    stride = wire.elements_per_packet()
    job = wire.job_id(JOB_NAME)
    ns = link.receiver
    ring = rxring.attach(ns, IFNAME, port=PORT, job=job, stride=stride, ranges=256,
                         regions=max(8, 2 * window))
    with netns.entered(ns):
        credit = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        child = start_sender(link)
        waiter = select.poll()
        waiter.register(ring.fileno(), select.POLLIN)

        def ready(i: int) -> None:
            ring.bind(message_id(i), ELEMENTS, p=1.0)
            credit.sendto(struct.pack("=I", message_id(i)), (SENDER_IP, CREDIT_PORT))

        total = WARMUP + messages
        for i in range(min(window, total)):
            ready(i)
        done_count, meter, kept = 0, None, 0.0
        while done_count < total:
            if not waiter.poll(10_000):
                raise RuntimeError(f"no event for 10 s after {done_count} messages "
                                   f"(verdicts {ring.stats()})")
            for event in ring.consume():
                if not event.complete:
                    continue
                m = ring.message(event.message)
                if copy:
                    kept += float(m.values.copy()[0])   # the application's copy
                ring.release(event.message)
                done_count += 1
                if done_count == WARMUP:
                    meter = Meter()
                if done_count - 1 + window < total:
                    ready(done_count - 1 + window)
        assert meter is not None
        sender_cpu = finish_sender(child, credit)
        cost = meter.stop(messages, sender_cpu)
        stats = ring.stats()
        if stats["unbound"] or any(stats[r] for r in rxring.malformed()):
            raise RuntimeError(f"datagrams not placed: {stats}")
        return cost
    finally:
        credit.close()
        ring.detach()


def describe(name: str, c: Cost) -> str:
    n = c.messages
    return (f"{name} {c.per_message_us():6.0f} us a message (process {c.cpu_s / n * 1e6:.0f}"
            f" + softirq {c.softirq_s / n * 1e6:.0f}; {c.switches / n:.1f} switches; "
            f"sender {c.sender_cpu_s / (n + WARMUP) * 1e6:.0f} us)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=400)
    parser.add_argument("--window", type=int, default=4,
                        help="messages the sender may have in flight (credits)")
    parser.add_argument("--current-xdp", choices=("generic", "none"), default="generic",
                        help="the XDP counter on the current path's interface")
    parser.add_argument("--no-copy", action="store_true",
                        help="the kernel path does not copy a message's vector out")
    parser.add_argument("--sender", action="store_true", help=argparse.SUPPRESS)
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    if args.sender:
        sender_main(args)
        return
    from tests.datapath.udp_link import build_link, remove_link

    watch = hostcheck.before(args)
    costs: dict[str, list[Cost]] = {"current": [], "kernel": []}
    link = build_link("rxk")
    try:
        for run in range(args.runs):
            host = hostcheck.Watch()
            costs["current"].append(run_current(link, args.messages, args.window,
                                                args.current_xdp == "generic"))
            costs["kernel"].append(run_kernel(link, args.messages, args.window,
                                              not args.no_copy))
            verdict = hostcheck.judged(host.stop())
            print(f"run {run + 1}/{args.runs} [{verdict['verdict']}]: "
                  + "; ".join(describe(name, c[-1]) for name, c in costs.items()),
                  flush=True)
    finally:
        remove_link(link)
    cur = statistics.median(c.per_message_us() for c in costs["current"])
    ker = statistics.median(c.per_message_us() for c in costs["kernel"])
    sw = {k: statistics.median(c.switches / c.messages for c in v) for k, v in costs.items()}
    print(f"\nmedians of {args.runs} runs, {args.messages} messages of {ELEMENTS * 4 // 1000} KB "
          f"each, window {args.window}: receiver CPU + host softirq a message, current "
          f"{cur:.0f} us (XDP {args.current_xdp}), kernel {ker:.0f} us"
          f"{'' if not args.no_copy else ' (no copy-out)'}: current / kernel = {cur / ker:.2f}; "
          f"context switches a message {sw['current']:.1f} against {sw['kernel']:.1f}")
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
