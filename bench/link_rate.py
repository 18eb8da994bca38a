"""Does a shaped link go faster than its rate? Two namespaces joined by a veth shaped
at both ends as tailcut shapes a link (HTB, one class), for each given bucket and GSO
packet size: the median time of a 259 KB TCP message with a one-byte answer, one
every 5 ms (250 rounds after 50 of warm-up), then 3 s of bulk TCP. Root.

    .venv/bin/python bench/link_rate.py [--rate 1gbit] BUCKET[/GSO] ...

    e.g. bench/link_rate.py 125000 67050 34282/32768 17898/16384

BUCKET is HTB's burst and cburst in bytes; GSO the veth ends' gso_max_size (unset:
the kernel's 64 KiB). docs/network.md#a-link-is-no-faster-than-its-rate has the
figures. The namespaces are tc-linkrate-a and -b, removed at the end."""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import hostcheck  # noqa: E402

A, B = "tc-linkrate-a", "tc-linkrate-b"
SERVER_IP = "10.99.0.2"
MESSAGE_BYTES = 259_000

MESSAGE_SERVER = f"""
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("{SERVER_IP}", 5001)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); buf = bytearray(1 << 20)
while True:
    got = 0
    while got < {MESSAGE_BYTES}:
        k = c.recv_into(memoryview(buf)[:{MESSAGE_BYTES} - got])
        if not k:
            raise SystemExit(0)
        got += k
    c.sendall(b"x")
"""
MESSAGE_CLIENT = f"""
import socket, statistics, time
c = socket.create_connection(("{SERVER_IP}", 5001))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
msg, times = b"x" * {MESSAGE_BYTES}, []
for _ in range(300):
    time.sleep(0.005)
    t = time.perf_counter(); c.sendall(msg); c.recv(1); times.append(time.perf_counter() - t)
print(statistics.median(times[50:]) * 1e3)
"""
BULK_SERVER = f"""
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("{SERVER_IP}", 5002)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); got, t = 0, None
while True:
    k = c.recv(1 << 20)
    if not k:
        break
    t = t or time.perf_counter()
    got += len(k)
print(got * 8 / (time.perf_counter() - t) / 1e9)
"""
BULK_CLIENT = f"""
import socket, time
c = socket.create_connection(("{SERVER_IP}", 5002)); end = time.time() + 3
while time.time() < end:
    c.sendall(b"x" * (1 << 20))
"""


def sh(cmd: str) -> None:
    subprocess.run(cmd, shell=True, check=True)


def build(rate: str, bucket: int, gso: int | None) -> None:
    sh(f"ip netns add {A} && ip netns add {B}")
    sh(f"ip link add va netns {A} type veth peer name vb netns {B}")
    for ns, dev, ip in ((A, "va", "10.99.0.1"), (B, "vb", SERVER_IP)):
        sh(f"ip -n {ns} addr add {ip}/24 dev {dev} && ip -n {ns} link set {dev} up"
           f" && ip -n {ns} link set lo up")
        if gso:
            sh(f"ip -n {ns} link set {dev} gso_max_size {gso}")
        sh(f"tc -n {ns} qdisc add dev {dev} root handle 1: htb default 1")
        sh(f"tc -n {ns} class add dev {dev} parent 1: classid 1:1 htb rate {rate} "
           f"ceil {rate} burst {bucket} cburst {bucket} 2>/dev/null")


def remove() -> None:
    subprocess.run(f"ip netns del {A}; ip netns del {B}", shell=True, stderr=subprocess.DEVNULL)


def pair(server: str, client: str) -> tuple[str, float]:
    """Run `server` in B and `client` in A; the server's and the client's last line,
    and the client's CPU seconds."""
    srv = subprocess.Popen(["ip", "netns", "exec", B, sys.executable, "-c", server],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert srv.stdout is not None and srv.stdout.readline().strip() == "ready"
        before = os.times()
        out = subprocess.run(["ip", "netns", "exec", A, sys.executable, "-c", client],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        after = os.times()
        srv_out = srv.communicate(timeout=10)[0]
    finally:
        srv.kill()
    cpu = (after.children_user + after.children_system
           - before.children_user - before.children_system)
    return (out.strip() or srv_out.strip()).splitlines()[-1], cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="1gbit", help="HTB rate, tc spelling")
    parser.add_argument("configs", nargs="+", metavar="BUCKET[/GSO]")
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    watch = hostcheck.before(args)
    print(f"| bucket / GSO (bytes) | {MESSAGE_BYTES}-byte message, ms | its Gbit/s "
          f"| client CPU, s | bulk Gbit/s |  (rate {args.rate})")
    for config in args.configs:
        bucket, _, gso = config.partition("/")
        remove()
        try:
            build(args.rate, int(bucket), int(gso) if gso else None)
            ms, cpu = pair(MESSAGE_SERVER, MESSAGE_CLIENT)
            bulk, _ = pair(BULK_SERVER, BULK_CLIENT)
            print(f"| {bucket} / {gso or 'kernel'} | {float(ms):.2f} | "
                  f"{MESSAGE_BYTES * 8 / float(ms) / 1e6:.2f} | {cpu:.2f} | "
                  f"{float(bulk):.3f} |", flush=True)
            time.sleep(0.2)
        finally:
            remove()
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
