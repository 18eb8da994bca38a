"""How much of a shaped link a high-priority TCP flow gets against a low one, with the
CadentFlow classifier and without it (both flows in the default class), side by side.

    sudo .venv/bin/python bench/priority_share.py [--rounds 3] [--rate 100Mbit]

One veth pair between two namespaces, the sender's egress shaped by HTB with two
priority classes; per round, two bulk TCP flows run for --seconds at once (flow A
tagged level 0, flow B level 1), first with the classifier attached, then without.
Prints each flow's goodput and A's share, medians over rounds.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import hostcheck  # noqa: E402
from tailcut.datapath import classifier  # noqa: E402
from tailcut.net import netns, shaping, tc  # noqa: E402
from tailcut.spec import units  # noqa: E402
from tailcut.spec.model import Link  # noqa: E402
from tests.datapath import udp_link  # noqa: E402  (the two-namespace link of the tests)


def goodputs_mbit(link: udp_link.Link, levels: list[int], port: int,
                  seconds: float) -> list[float]:
    results = [0.0] * len(levels)
    servers = []
    for i in range(len(levels)):
        with netns.entered(link.receiver):
            srv = socket.socket()
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.bind((udp_link.RECEIVER_IP, port + i))
            srv.listen(1)
            srv.settimeout(5)
        servers.append(srv)

    def receive(i: int) -> None:
        conn, _ = servers[i].accept()
        total, start = 0, time.monotonic()
        while data := conn.recv(1 << 20):
            total += len(data)
        results[i] = total * 8 / (time.monotonic() - start) / 1e6
        conn.close()

    def send(i: int) -> None:
        with netns.entered(link.sender):
            s = socket.socket()
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, classifier.tos_of(levels[i]))
        s.connect((udp_link.RECEIVER_IP, port + i))
        buf, end = bytes(1 << 16), time.monotonic() + seconds
        while time.monotonic() < end:
            s.sendall(buf)
        s.close()

    threads = [threading.Thread(target=f, args=(i,)) for i in range(len(levels))
               for f in (receive, send)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 10)
    for srv in servers:
        srv.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rate", default="100Mbit")
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (it builds network namespaces)", file=sys.stderr)
        return 2
    watch = hostcheck.before(args)
    rate = units.parse_bandwidth(args.rate)
    link = udp_link.build_link("share")
    rows: dict[str, list[tuple[float, float]]] = {"classifier": [], "no classifier": []}
    try:
        with netns.ipr(link.sender) as ipr:
            tc.apply(shaping.plan(Link(bandwidth=args.rate), False, "bench"), ipr,
                          link.sender, udp_link.IFNAME)
            tc.apply_priorities(shaping.plan_priorities(rate, 2), ipr, udp_link.IFNAME)
        for r in range(args.rounds):
            with classifier.attach(link.sender, udp_link.IFNAME):
                a, b = goodputs_mbit(link, [0, 1], 46500 + 10 * r, args.seconds)
            rows["classifier"].append((a, b))
            a, b = goodputs_mbit(link, [0, 1], 46505 + 10 * r, args.seconds)
            rows["no classifier"].append((a, b))
            print(f"round {r}: classifier A {rows['classifier'][-1][0]:.1f} B "
                  f"{rows['classifier'][-1][1]:.1f}; no classifier A {a:.1f} B {b:.1f} "
                  "Mbit/s", flush=True)
    finally:
        udp_link.remove_link(link)
    print(f"\nlink {args.rate}, {args.seconds:g} s per flow pair, medians of {args.rounds}")
    print(f"{'':>14} {'A (level 0)':>12} {'B (level 1)':>12} {'A share':>8}")
    for name, pairs in rows.items():
        a = statistics.median(p[0] for p in pairs)
        b = statistics.median(p[1] for p in pairs)
        share = statistics.median(p[0] / (p[0] + p[1]) for p in pairs)
        print(f"{name:>14} {a:>12.1f} {b:>12.1f} {share:>8.3f}")
    hostcheck.after(watch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
