"""The receive thread's CPU per read: rxfast.c against the numpy code, side by side.

    .venv/bin/python bench/rx_batch_cost.py [--runs 5] [--messages 200]

One sender sends quickstart-sized messages (259 KB: 180 datagrams, UDP GSO) over
loopback to a socket read as the bounded-loss receive thread reads it
(batch.GroInbox, then receiver.Receiver.accept). Per run, the same messages are
received once with each path, in turn; the CPU of the reading thread
(time.thread_time) per read and per message is printed, with the ratio numpy /
compiled, and medians over the runs. No shaping, no XDP: what this isolates is the
user-space work per read, which the quickstart's receive threads do ~13,000 times
(docs/bounded-loss.md, "Where a message's CPU goes")."""

from __future__ import annotations

import argparse
import collections
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import hostcheck  # noqa: E402
from tailcut.transports import batch, receiver, rxfast, sender, wire  # noqa: E402
from tailcut.transports.base import Kind  # noqa: E402

JOB = 7
STRIDE = wire.elements_per_packet()
ELEMENTS = 64_800  # the quickstart mlp's 259 KB
PER_GSO = batch.max_segments(wire.HEADER_BYTES + 4 * STRIDE)  # 22 datagrams (44 before Nov 27)


@dataclass(eq=False)
class Peer:
    peer_id: int = 1
    udp_addr: tuple[str, int] = ("127.0.0.1", 0)


def receive(compiled: bool, messages: int) -> tuple[float, int]:
    """Send ``messages`` messages and read them; the reader's CPU (s) and its reads."""
    rx_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    rx_sock.bind(("127.0.0.1", 0))
    tx_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx_sock.bind(("127.0.0.1", 0))
    source = batch.ipv4("127.0.0.1")
    r = receiver.Receiver(JOB, STRIDE, 1.0, True, False, 1 << 26, collections.Counter())
    if not compiled:
        r.native = None
    inbox = batch.GroInbox(rx_sock, 128, r.row_bytes)
    if not compiled:
        inbox._native, inbox.addresses = None, None
    peer = Peer()
    r.peers[1] = (peer, source)
    values = np.random.default_rng(0).standard_normal(ELEMENTS).astype(np.float32)
    rng = np.random.default_rng(1)
    cpu, reads = 0.0, 0
    try:
        for i in range(messages):
            message = (1 << 16) | (i + 1)
            r.begin(peer, source, message, int(Kind.PUSH), 0, 0, ELEMENTS, 0)
            packets = sender.Packets(values, JOB, message, int(Kind.PUSH), STRIDE)
            order = rng.permutation(len(packets))
            packets.number(order, 0, 0)
            out = packets.batch(tx_sock, order, rx_sock.getsockname(), gso=True)
            done: list[receiver.Done] = []
            for first in range(0, len(order), PER_GSO):
                # One GSO message (what one burst of a paced sender is), then its read.
                out.send(first, min(PER_GSO, len(order) - first))
                started = time.thread_time()
                n = 0
                while not n:
                    n = inbox.recv()
                reads += 1
                r.accept(inbox.rows(n), inbox.lengths(n), inbox.sources(n), done, None,
                         inbox.addresses)
                cpu += time.thread_time() - started
            assert done[0].reason == "full", done
    finally:
        rx_sock.close()
        tx_sock.close()
    return cpu, reads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--messages", type=int, default=200)
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    if rxfast.library() is None:
        sys.exit(f"the compiled path is not available: {rxfast.status()}")
    watch = hostcheck.before(args)
    per_read: dict[bool, list[float]] = {True: [], False: []}
    per_message: dict[bool, list[float]] = {True: [], False: []}
    for run in range(args.runs):
        line = []
        for compiled in (True, False):
            cpu, reads = receive(compiled, args.messages)
            per_read[compiled].append(cpu / reads * 1e6)
            per_message[compiled].append(cpu / args.messages * 1e6)
            line.append(f"{'compiled' if compiled else 'numpy'} {cpu / reads * 1e6:6.1f} us "
                        f"a read ({reads / args.messages:.1f} reads a message)")
        print(f"run {run + 1}/{args.runs}: " + ", ".join(line), flush=True)
    c, n = statistics.median(per_message[True]), statistics.median(per_message[False])
    print(f"\nmedians of {args.runs} runs, {args.messages} messages of {ELEMENTS * 4 // 1000} KB "
          f"each: CPU a read compiled {statistics.median(per_read[True]):.1f} us, numpy "
          f"{statistics.median(per_read[False]):.1f} us; a message {c:.0f} us against "
          f"{n:.0f} us: numpy / compiled = {n / c:.2f}")
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
