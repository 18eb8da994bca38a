"""The XDP counter's cost: ns per packet by BPF_PROG_TEST_RUN, and the UDP receive rate
on an unshaped veth with and without the counter attached (generic and native mode).

    .venv/bin/python bench/bl_xdp_cost.py [--runs 3] [--packets 200000]

Root. Medians of --runs; the receive-rate variants are interleaved within each run."""

import argparse
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import hostcheck  # noqa: E402
from tailcut.datapath import bpfsys, partial
from tailcut.runtime import procs
from tailcut.transports import wire
from tests.datapath.frames import udp_frame
from tests.datapath.udp_link import IFNAME, RECEIVER_IP, build_link, remove_link

PORT = 7300
JOB = wire.job_id("bl-bench-xdp")
REPEAT = 1_000_000

RECEIVER = """
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)
s.bind(("{ip}", {port})); s.settimeout(60.0); print("ready", flush=True)
n = 0; first = last = None
try:
    while True:
        s.recv(2048); n += 1
        last = time.monotonic()
        if first is None:
            first = last
            s.settimeout(1.0)  # the sender has started: 1 s of silence ends the count
except socket.timeout:
    pass
print(n, (n - 1) / (last - first) if n > 1 else 0)
"""

SENDER = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
pkt = bytes.fromhex("{pkt}")
for i in range({count}):
    s.sendto(pkt, ("{ip}", {port}))
"""


def test_run_ns() -> dict[str, float]:
    prog = partial.load(port=PORT, job=JOB, p=0.9, stride=360)
    try:
        fd = prog.fds[partial.FUNCTION]
        values = np.zeros(360, np.float32)
        out = {}
        # A new slot every run would need 10^6 slots; the first run counts it, the
        # other 999999 take the duplicate path, which does the same lookups and atomics
        # up to the bit test.
        counted = wire.build(job=JOB, message=1, seq=0, start=0, total=3600, values=values)
        out["our port, counted/duplicate"] = bpfsys.test_run(fd, udp_frame(counted, PORT),
                                                             REPEAT)[1]
        out["our port, bad magic"] = bpfsys.test_run(
            fd, udp_frame(b"XXXX" + counted[4:], PORT), REPEAT)[1]
        out["other UDP port"] = bpfsys.test_run(fd, udp_frame(counted, PORT + 1), REPEAT)[1]
        return out
    finally:
        prog.close()


def receive_rate(link, packets: int, mode: str | None) -> float:
    counter = None
    if mode:
        counter = partial.attach(IFNAME, port=PORT, job=JOB, p=0.9, stride=360, mode=mode,
                                 netns_name=link.receiver)
    try:
        rx = procs.spawn(link.receiver, [sys.executable, "-c", textwrap.dedent(
            RECEIVER.format(ip=RECEIVER_IP, port=PORT))], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env={})
        assert rx.stdout is not None and rx.stdout.readline().strip() == b"ready"
        pkt = wire.build(job=JOB, message=7, seq=0, start=0, total=3600,
                         values=np.zeros(360, np.float32))
        tx = procs.spawn(link.sender, [sys.executable, "-c", textwrap.dedent(SENDER.format(
            pkt=pkt.hex(), count=packets, ip=RECEIVER_IP, port=PORT))],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={})
        _, tx_err = tx.communicate(timeout=120)
        if tx.returncode != 0:
            raise RuntimeError(f"sender failed: {tx_err.decode()}")
        out, err = rx.communicate(timeout=60)
        got, rate = out.split()
        return float(rate)
    finally:
        if counter is not None:
            counter.detach()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--packets", type=int, default=200_000)
    hostcheck.add_arguments(ap)
    args = ap.parse_args()
    watch = hostcheck.before(args)
    costs = [test_run_ns() for _ in range(args.runs)]
    print(f"BPF_PROG_TEST_RUN, {REPEAT} runs each, median of {args.runs}:")
    for key in costs[0]:
        print(f"  {key:<28} {statistics.median(c[key] for c in costs):6.0f} ns per packet")
    rates: dict[str, list[float]] = {"none": [], "generic": [], "native": []}
    link = build_link("bench")
    try:
        for run in range(args.runs):
            for mode in rates:
                rates[mode].append(receive_rate(link, args.packets, None if mode == "none"
                                                else mode))
            print(f"run {run + 1}: " + ", ".join(f"{m} {r[-1] / 1e3:.0f} kpps"
                                                 for m, r in rates.items()), flush=True)
    finally:
        remove_link(link)
    base = statistics.median(rates["none"])
    print(f"\nUDP receive rate on an unshaped veth, {args.packets} 1472-byte datagrams from "
          f"one Python sender, median of {args.runs}:")
    for mode, r in rates.items():
        med = statistics.median(r)
        print(f"  XDP {mode:<8} {med / 1e3:6.1f} kpps  ratio to no XDP {med / base:.3f}")
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
