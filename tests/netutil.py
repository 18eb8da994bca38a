"""Traffic for tests: small Python senders and receivers run inside pod namespaces."""

import contextlib
import socket
import struct
import subprocess
import sys
import textwrap
import time

from tailcut.net import netns
from tailcut.runtime import procs
from tailcut.transports import batch

TCP_RECEIVER = """
import socket, sys, time
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", {port})); srv.listen(1); print("ready", flush=True)
conn, _ = srv.accept(); total = 0; first = None
while True:
    data = conn.recv(1 << 20)
    if not data:
        break
    if first is None:
        first = time.monotonic()
    total += len(data)
    if time.monotonic() - first < {warmup}:
        start_bytes = total
        start = time.monotonic()
print((total - start_bytes) * 8 / (time.monotonic() - start) / 1e6)
"""

TCP_SENDER = """
import socket, time
s = socket.create_connection(("{ip}", {port}), timeout=5)
buf = b"x" * (1 << 16); end = time.monotonic() + {seconds}
while time.monotonic() < end:
    s.sendall(buf)
s.close()
"""

# A message and a one-byte answer, again and again with the link idle in between.
TCP_ECHO_RECEIVER = """
import socket
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", {port})); srv.listen(1); print("ready", flush=True)
conn, _ = srv.accept(); buf = bytearray(1 << 20)
while True:
    got = 0
    while got < {size}:
        n = conn.recv_into(memoryview(buf)[:{size} - got])
        if not n:
            raise SystemExit(0)
        got += n
    conn.sendall(b"x")
"""

TCP_MESSAGE_SENDER = """
import socket, statistics, time
s = socket.create_connection(("{ip}", {port}), timeout=5)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
message, times = b"x" * {size}, []
for _ in range({rounds}):
    time.sleep(0.01)
    start = time.perf_counter(); s.sendall(message); s.recv(1)
    times.append(time.perf_counter() - start)
print(statistics.median(times[{rounds} // 5:]) * 1e3)
"""

UDP_RECEIVER = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 24)
s.bind(("0.0.0.0", {port})); s.settimeout(2.0); print("ready", flush=True)
got = 0
try:
    while True:
        s.recv(2048); got += 1
except socket.timeout:
    pass
print(got)
"""

UDP_SENDER = """
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range({count}):
    s.sendto(i.to_bytes(4, "big") * 64, ("{ip}", {port}))
    if i % 200 == 199:
        time.sleep(0.002)  # pace: no socket or queue drop may blur the link's loss
"""


def start(ns: str, code: str) -> subprocess.Popen:
    return procs.spawn(ns, [sys.executable, "-c", textwrap.dedent(code)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={})


def _wait_ready(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()
    assert line.strip() == b"ready", proc.stderr.read().decode()


def _finish(proc: subprocess.Popen, timeout: float) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err.decode()
    return out.decode().strip()


def tcp_goodput_mbit(src_ns: str, dst_ns: str, dst_ip: str, seconds: float = 3.0,
                     port: int = 5201) -> float:
    """Goodput seen by a receiver in `dst_ns`, after a 0.5 s warm-up."""
    rx = start(dst_ns, TCP_RECEIVER.format(port=port, warmup=0.5))
    _wait_ready(rx)
    tx = start(src_ns, TCP_SENDER.format(ip=dst_ip, port=port, seconds=seconds))
    _finish(tx, seconds + 10)
    return float(_finish(rx, 10))


def tcp_message_ms(src_ns: str, dst_ns: str, dst_ip: str, size: int, rounds: int = 50,
                   port: int = 5204) -> float:
    """Median time of a `size`-byte TCP message and a one-byte answer, each sent after
    10 ms of idle link (the first fifth of the rounds not counted)."""
    rx = start(dst_ns, TCP_ECHO_RECEIVER.format(port=port, size=size))
    _wait_ready(rx)
    tx = start(src_ns, TCP_MESSAGE_SENDER.format(ip=dst_ip, port=port, size=size,
                                                 rounds=rounds))
    ms = float(_finish(tx, 60))
    _finish(rx, 10)
    return ms


def udp_delivered(src_ns: str, dst_ns: str, dst_ip: str, count: int,
                  port: int = 5202) -> int:
    """How many of `count` paced UDP datagrams a receiver in `dst_ns` got."""
    rx = start(dst_ns, UDP_RECEIVER.format(port=port))
    _wait_ready(rx)
    tx = start(src_ns, UDP_SENDER.format(ip=dst_ip, port=port, count=count))
    _finish(tx, 60)
    return int(_finish(rx, 30))


SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33   # <asm-generic/socket.h>; not in Python 3.11


def udp_burst_received(src_ns: str, dst_ns: str, dst_ip: str, count: int,
                       size_bytes: int = 1000, priority: int = 0, port: int = 5205) -> int:
    """Send `count` numbered datagrams of `size_bytes` back to back (no pacing: they
    pile up in front of a slower link), into HTB class `priority` (SO_PRIORITY =
    major:minor) if not 0; return how many distinct ones a receiver in `dst_ns` got."""
    with netns.entered(dst_ns):
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with netns.entered(src_ns):
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    seen: set[int] = set()
    try:
        rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
        rx.bind((dst_ip, port))
        rx.settimeout(1.0)
        # A socket out of room would make the sender wait: no burst, nothing dropped.
        tx.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, 64 << 20)
        if priority:
            tx.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, priority)
        pad = bytes(size_bytes - 8)
        for seq in range(count):
            tx.sendto(struct.pack("!Q", seq) + pad, (dst_ip, port))
        try:
            while True:
                seen.add(struct.unpack_from("!Q", rx.recv(65536))[0])
        except socket.timeout:
            pass
    finally:
        rx.close()
        tx.close()
    return len(seen)


def udp_gso_received(src_ns: str, dst_ns: str, dst_ip: str, messages: int, segments: int,
                     segment_bytes: int = 1400, port: int = 5206) -> list[int]:
    """Send `messages` UDP GSO messages of `segments` numbered datagrams each (one
    sendto each, cut by the kernel), paced; return how many datagrams of each message
    a receiver in `dst_ns` got."""
    with netns.entered(dst_ns):
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with netns.entered(src_ns):
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    got = [0] * messages
    try:
        rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
        rx.bind((dst_ip, port))
        rx.settimeout(1.0)
        tx.setsockopt(batch.SOL_UDP, batch.UDP_SEGMENT, segment_bytes)  # the kernel cuts
        pad = bytes(segment_bytes - 8)
        for m in range(messages):
            tx.sendto(b"".join(struct.pack("!II", m, i) + pad for i in range(segments)),
                      (dst_ip, port))
            if m % 20 == 19:
                time.sleep(0.002)  # pace: no queue may drop what the link's loss spares
        try:
            while True:
                got[struct.unpack_from("!I", rx.recv(65536))[0]] += 1
        except socket.timeout:
            pass
    finally:
        rx.close()
        tx.close()
    return got


@contextlib.contextmanager
def linked_namespaces(names: tuple[str, str], ips: tuple[str, str], mtu: int = 1550):
    """Two namespaces joined by a veth (lan0 in each, ips/24, of `mtu`: room for a
    VXLAN around 1500 bytes, as the cluster's LAN): two nodes and their LAN. Both are
    removed afterwards."""
    for name in names:
        netns.create(name)
    try:
        with netns.ipr(names[0]) as ipr:
            ipr.link("add", ifname="lan0", kind="veth",
                     peer={"ifname": "lan0", "net_ns_fd": netns.path(names[1])})
        for name, ip in zip(names, ips):
            with netns.ipr(name) as ipr:
                index = ipr.link_lookup(ifname="lan0")[0]
                ipr.addr("add", index=index, address=ip, prefixlen=24)
                ipr.link("set", index=index, mtu=mtu, state="up")
        yield names
    finally:
        for name in names:
            netns.remove(name)
