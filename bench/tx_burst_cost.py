"""The send thread's CPU per pass: txfast.c against the numpy Batch, side by side.

    .venv/bin/python bench/tx_burst_cost.py [--runs 5] [--messages 200]

One sender sends quickstart-sized messages (259 KB: 180 datagrams) over loopback as
the bounded-loss send thread sends a pass (datagram.py's _transmit: sender.Packets,
number, then sender.pace in bursts of one UDP GSO message each, unpaced). Per run
the same messages go once with each path, in turn; the CPU of the sending thread
(time.thread_time, the kernel's share of sendmmsg included) per pass is printed, with
the ratio numpy / compiled, and medians over the runs. The receiving socket is
drained between passes, outside the timing. No shaping, no XDP: what this isolates is
the user-space work per pass and burst."""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import hostcheck  # noqa: E402
from bench.rx_batch_cost import ELEMENTS, JOB, STRIDE  # noqa: E402  (the same messages)
from tailcut.transports import batch, rxfast, sender, wire  # noqa: E402
from tailcut.transports.base import Kind  # noqa: E402



def send(compiled: bool, messages: int) -> float:
    """Send ``messages`` passes; the sending thread's CPU (s) over them."""
    rx_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    rx_sock.setsockopt(batch.SOL_UDP, batch.UDP_GRO, 1)   # a GSO message stays one skb
    rx_sock.bind(("127.0.0.1", 0))
    rx_sock.setblocking(False)
    tx_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx_sock.bind(("127.0.0.1", 0))
    library = rxfast.library
    if not compiled:
        rxfast.library = lambda: None   # what Packets.batch asks
    values = np.random.default_rng(0).standard_normal(ELEMENTS).astype(np.float32)
    rng = np.random.default_rng(1)
    never = threading.Event()
    burst = sender.burst_floor(True, wire.DEFAULT_MTU)
    cpu = 0.0
    try:
        for i in range(messages):
            order = rng.permutation(wire.slots(ELEMENTS, STRIDE))
            started = time.thread_time()
            packets = sender.Packets(values, JOB, (1 << 16) | (i + 1), int(Kind.PUSH), STRIDE)
            packets.number(order, 0, 0)
            done = sender.pace(tx_sock, rx_sock.getsockname(), packets, order, None, never,
                               None, "bench", gso=True, burst_packets=burst)
            cpu += time.thread_time() - started
            assert done.sent == len(order)
            while True:
                try:
                    rx_sock.recv(70_000)
                except BlockingIOError:
                    break
    finally:
        rxfast.library = library
        rx_sock.close()
        tx_sock.close()
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--messages", type=int, default=200)
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    if rxfast.library() is None:
        sys.exit(f"the compiled path is not available: {rxfast.status()}")
    watch = hostcheck.before(args)
    per_pass: dict[bool, list[float]] = {True: [], False: []}
    for run in range(args.runs):
        line = []
        for compiled in (True, False):
            cpu = send(compiled, args.messages)
            per_pass[compiled].append(cpu / args.messages * 1e6)
            line.append(f"{'compiled' if compiled else 'numpy'} "
                        f"{cpu / args.messages * 1e6:6.1f} us a pass")
        print(f"run {run + 1}/{args.runs}: " + ", ".join(line), flush=True)
    c, n = statistics.median(per_pass[True]), statistics.median(per_pass[False])
    print(f"\nmedians of {args.runs} runs, {args.messages} passes of "
          f"{ELEMENTS * 4 // 1000} KB each: send thread CPU a pass compiled {c:.0f} us, "
          f"numpy {n:.0f} us: numpy / compiled = {n / c:.2f}")
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
