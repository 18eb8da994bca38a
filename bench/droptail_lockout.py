"""Drop-tail lock-out: how much of a paced UDP flow gets through a shallow switch port
that TCP bulk flows keep full, at 200 Mbit/s and at 1 Gbit/s.

    sudo PYTHONPATH=. .venv/bin/python bench/droptail_lockout.py [--runs 3]
        [--rates 200Mbit 1Gbit] [--flows 0 1 4 16] [--loads 0.1 0.4] [--buffer 85000]
        [--extra 200Mbit:16:1.0] [--burst 4] [--cc bbr|cubic] [--delay-us 0 25]

Four namespaces (tclock-<pid>-*): two sender pods, `tcp` (N bulk TCP flows, plain
sockets) and `udp` (one paced UDP flow of 1472-byte datagrams with sequence numbers,
sent in bursts of --burst), a router `sw` with IP forwarding, and a receiver pod `rcv`.
The senders are two pods, as the background server and the worker are in tailcut's
background-shallow condition: one pod end at RATE for both would make that pod's own
deep queue, not the switch port, the bottleneck. Every end is shaped as tailcut's
build does (tailcut.net.shaping): pod ends HTB at RATE on the kernel's default queue,
gso_max_segs 1 and gso_max_size 32 KiB; switch ports HTB at RATE with a bfifo of
BUFFER bytes. The port under test is sw's egress towards rcv.

Per point: TCP runs from the start, the UDP flow is sent for --measure s after
--warmup s, the receiver counts distinct sequence numbers; TCP goodput is the bytes
the receiver read in that window; drops are the port's bfifo drops in that window
(`tc -s qdisc`). Also: UDP datagrams dropped at the UDP pod's own queue (pod q) and at
the receiving socket (rcvbuf); both should be 0; and any packet dropped at a CPU's
input backlog (backlog, the whole machine's: where a CPU too slow to forward drops).
With --runs > 1, medians per point.
Root. Every child ends by itself (coreutils timeout); the namespaces are deleted on exit.

--delay-us D (one row set per value): a fabric's delay, D microseconds one way at every
shaped end (the pod ends and the switch ports, netem under HTB as tailcut applies
`delayMs`; the port's bfifo becomes netem's child), so the RTT through the port is
4 D. It needs a kernel with netem: not this host's; Debian's user-mode Linux has it
(docs/network.md#a-kernel-with-netem-user-mode-linux).
"""

import argparse
import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# A role child (--role, below) needs none of tailcut: importing it costs ~5 s of CPU
# in user-mode Linux, and four children starting at once missed their start.
if sys.argv[1:2] != ["--role"]:
    from bench import hostcheck  # noqa: E402
    from tailcut import features  # noqa: E402
    from tailcut.net import netns, rtnl, shaping, tc  # noqa: E402
    from tailcut.spec.model import Link  # noqa: E402

PREFIX = f"tclock-{os.getpid()}-"
PODS = {"tcp": 1, "udp": 2, "rcv": 3}   # pod -> subnet 10.77.<n>.0/24: pod .2, sw .1
TCP_PORT, UDP_PORT, PAYLOAD = 5201, 5202, 1472


def ns(name: str) -> str:
    return PREFIX + name


def sh(*cmd: str, netns: str | None = None) -> str:
    full = (["ip", "netns", "exec", netns] if netns else []) + list(cmd)
    return subprocess.run(full, check=True, capture_output=True, text=True, timeout=20).stdout


# -- the network --------------------------------------------------------------------

def build() -> None:
    sw, gso = ns("sw"), str(shaping.GSO_BYTES)
    for name in ["sw", *PODS]:
        netns.create(ns(name))   # loopback up
    sh("sysctl", "-qw", "net.ipv4.ip_forward=1", netns=sw)
    for pod, n in PODS.items():
        sh("ip", "-n", sw, "link", "add", f"p-{pod}", "type", "veth",
           "peer", "name", "eth0", "netns", ns(pod))
        sh("ip", "-n", sw, "addr", "add", f"10.77.{n}.1/24", "dev", f"p-{pod}")
        sh("ip", "-n", sw, "link", "set", f"p-{pod}", "up", "gso_max_size", gso)
        sh("ip", "-n", ns(pod), "addr", "add", f"10.77.{n}.2/24", "dev", "eth0")
        sh("ip", "-n", ns(pod), "link", "set", "eth0", "up", "gso_max_segs", "1",
           "gso_max_size", gso)
        sh("ip", "-n", ns(pod), "route", "add", "default", "via", f"10.77.{n}.1")
    deadline = time.time() + 5   # both ends operationally up (PLATFORM.md: ARP)
    while any("state UP" not in sh("ip", "-n", ns(p), "link", "show", "eth0")
              for p in PODS) and time.time() < deadline:
        time.sleep(0.05)


def shape(rate: str, buffer: int, delay_us: float = 0.0) -> None:
    """What tailcut.net.build applies: access_ops on the switch ports, pod_end_ops on
    the pods' own ends (with netem only for a delay)."""
    link = Link(bandwidth=rate, buffer_bytes=buffer, delay_ms=delay_us / 1000)
    port_ops = shaping.plan(link, delay_us > 0, "bench")
    pod_ops = shaping.plan(shaping.host_end(link), delay_us > 0, "bench")
    targets = [(ns("sw"), f"p-{p}", port_ops) for p in PODS] + \
              [(ns(p), "eth0", pod_ops) for p in PODS]
    for netns, ifname, ops in targets:
        subprocess.run(["tc", "-n", netns, "qdisc", "del", "dev", ifname, "root"],
                       capture_output=True, timeout=20)   # a new rate: a new tree
        with rtnl.socket_in(netns) as sock:
            batch = rtnl.Batch()
            tc.add_requests(batch, ops, rtnl.ifindex(sock, ifname))
            batch.send(sock)


def teardown() -> None:
    """Delete every namespace of ours (tailcut's own remove: already gone is fine)."""
    for name in netns.list_names(PREFIX):
        netns.remove(name)


def qdisc_drops(netns: str, dev: str, kind: str) -> int:
    qdiscs = json.loads(sh("tc", "-s", "-j", "qdisc", "show", "dev", dev, netns=netns))
    return sum(q.get("drops", 0) for q in qdiscs if q["kind"] == kind)


def backlog_drops() -> int:
    """Packets the kernel dropped because a CPU's input backlog was full (a veth hands
    its packets to the peer through it): /proc/net/softnet_stat's second column,
    summed over CPUs (one machine-wide count)."""
    return sum(int(line.split()[1], 16) for line in open("/proc/net/softnet_stat"))


def rcvbuf_errors() -> int:
    lines = [line.split() for line in open("/proc/net/snmp") if line.startswith("Udp:")]
    return int(lines[1][lines[0].index("RcvbufErrors")])


# -- the roles, each run in its namespace by `ip netns exec` --------------------------

def tcp_sink(flows: int, w0: float, w1: float, stop: float) -> dict:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", TCP_PORT))
    srv.listen(flows)
    srv.settimeout(max(0.1, w0 - time.time()))
    got = [0] * flows

    def drain(conn: socket.socket, i: int) -> None:
        buf = bytearray(1 << 18)
        conn.settimeout(0.2)
        while time.time() < stop:
            try:
                n = conn.recv_into(buf)
            except socket.timeout:
                continue
            if not n:
                break
            if w0 <= time.time() < w1:
                got[i] += n
    threads = []
    for i in range(flows):
        conn, _ = srv.accept()
        threads.append(threading.Thread(target=drain, args=(conn, i), daemon=True))
        threads[-1].start()
    for t in threads:
        t.join(max(0, stop - time.time()) + 1)
    return {"bytes": sum(got)}


def tcp_src(flows: int, stop: float) -> dict:
    def push() -> None:
        s = socket.socket()
        while time.time() < stop:   # the sink may not listen yet
            if os.environ.get("TCLOCK_CC"):   # --cc, per socket: the netns may not allow it
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION,
                             os.environ["TCLOCK_CC"].encode())
            try:
                s.connect(("10.77.3.2", TCP_PORT))
                break
            except OSError:
                s.close()
                s = socket.socket()
                time.sleep(0.05)
        s.settimeout(0.2)
        data = bytes(1 << 20)
        while time.time() < stop:
            try:
                s.send(data)
            except socket.timeout:
                pass
            except OSError:   # the sink closed first
                break
        s.close()
    threads = [threading.Thread(target=push, daemon=True) for _ in range(flows)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0, stop - time.time()) + 1)
    return {}


def udp_sink(stop: float) -> dict:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)   # SO_RCVBUFFORCE
    s.bind(("0.0.0.0", UDP_PORT))
    s.settimeout(0.1)
    errors0, seen = rcvbuf_errors(), set()
    while time.time() < stop:
        try:
            seen.add(struct.unpack("!Q", s.recv(8))[0])   # a truncated read: the seq
        except socket.timeout:
            pass
    return {"distinct": len(seen), "rcvbuf_errors": rcvbuf_errors() - errors0}


def udp_src(rate_bit: float, burst: int, w0: float, w1: float) -> dict:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(("10.77.3.2", UDP_PORT))
    packet = bytearray(PAYLOAD)
    gap = burst * PAYLOAD * 8 / rate_bit   # seconds between bursts
    seq = k = 0
    while True:
        due = w0 + k * gap
        now = time.time()
        if due >= w1 or now >= w1:
            break
        if due > now:
            time.sleep(due - now)
        for _ in range(burst):
            struct.pack_into("!Q", packet, 0, seq)
            try:
                s.send(packet)
                seq += 1
            except OSError:
                pass
        k += 1
    return {"sent": seq, "secs": time.time() - w0}


ROLES = {"tcp-sink": tcp_sink, "tcp-src": tcp_src, "udp-sink": udp_sink, "udp-src": udp_src}


# -- one point ----------------------------------------------------------------------

def spawn(pod: str, role: str, *args: object, limit: float) -> subprocess.Popen:
    cmd = ["ip", "netns", "exec", ns(pod), "timeout", "-s", "KILL", f"{limit:.0f}",
           sys.executable, __file__, "--role", role, *map(str, args)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def point(rate: str, flows: int, load: float, a: argparse.Namespace,
          delay_us: float = 0.0) -> dict:
    rate_bit = Link(bandwidth=rate).bandwidth
    w0 = time.time() + a.start + a.warmup     # --start s for the children to start
    w1 = w0 + a.measure
    stop = w1 + 0.5
    limit = stop - time.time() + 10
    children = {"udp-sink": spawn("rcv", "udp-sink", stop, limit=limit)}
    if flows:
        children["tcp-sink"] = spawn("rcv", "tcp-sink", flows, w0, w1, stop, limit=limit)
        time.sleep(0.3)
        children["tcp-src"] = spawn("tcp", "tcp-src", flows, stop, limit=limit)
    children["udp-src"] = spawn("udp", "udp-src", rate_bit * load, a.burst, w0, w1,
                                limit=limit)
    try:
        time.sleep(max(0, w0 - time.time()))
        drops0 = qdisc_drops(ns("sw"), "p-rcv", "bfifo")
        backlog0 = backlog_drops()
        pod0 = qdisc_drops(ns("udp"), "eth0", "htb")
        time.sleep(max(0, w1 - time.time()))
        drops = qdisc_drops(ns("sw"), "p-rcv", "bfifo") - drops0
        backlog = backlog_drops() - backlog0
        pod_drops = qdisc_drops(ns("udp"), "eth0", "htb") - pod0
        out = {}
        for role, proc in children.items():
            stdout, _ = proc.communicate(timeout=limit)
            out.update(json.loads(stdout or "{}"))
    finally:
        for proc in children.values():
            if proc.poll() is None:
                proc.terminate()   # `timeout` (ip netns exec execs it) passes it on
    failed = [role for role, proc in children.items() if proc.returncode != 0]
    if failed or (flows and "bytes" not in out):
        raise RuntimeError(f"{rate}, {flows} TCP flows: {failed or 'tcp-sink'} reported "
                           "nothing (a flow that did not connect in time?)")
    sent, got = out["sent"], out["distinct"]
    return {"rate": rate, "delay us": delay_us, "N": flows, "U": f"{load:.0%}",
            "sent": sent, "sent Mbit/s": sent * PAYLOAD * 8 / out["secs"] / 1e6,
            "delivered": got / sent if sent else float("nan"), "UDP lost": sent - got,
            "pkt/ms": got / a.measure / 1000,
            "UDP Mbit/s": got * PAYLOAD * 8 / a.measure / 1e6,
            "TCP Mbit/s": out.get("bytes", 0) * 8 / a.measure / 1e6,
            "bfifo drops": drops, "pod q": pod_drops, "rcvbuf": out["rcvbuf_errors"],
            "backlog": backlog}


def table(rows: list[dict]) -> str:
    cols = list(rows[0])
    cells = [[f"{r[c]:.3f}" if isinstance(r[c], float) and c == "delivered"
              else f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in cols]
             for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    return "\n".join("  ".join(x.rjust(w) for x, w in zip(line, widths))
                     for line in [cols, *cells])


def median_rows(runs: list[list[dict]]) -> list[dict]:
    return [{k: statistics.median(r[k] for r in same) if isinstance(v, (int, float)) else v
             for k, v in same[0].items()} for same in zip(*runs)]


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--role":
        role, args = sys.argv[2], [float(x) for x in sys.argv[3:]]
        if role in ("tcp-sink", "tcp-src"):
            args[0] = int(args[0])
        if role == "udp-src":
            args[1] = int(args[1])
        print(json.dumps(ROLES[role](*args)), flush=True)
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", nargs="+", default=["200Mbit", "1Gbit"])
    p.add_argument("--flows", nargs="+", type=int, default=[0, 1, 4, 16])
    p.add_argument("--loads", nargs="+", type=float, default=[0.1, 0.4],
                   help="UDP send rate as a fraction of the port's rate")
    p.add_argument("--extra", nargs="*", default=["200Mbit:16:1.0"],
                   help="more points, RATE:N:LOAD")
    p.add_argument("--buffer", type=int, default=85_000, help="bfifo bytes")
    p.add_argument("--burst", type=int, default=4, help="UDP datagrams per burst")
    p.add_argument("--start", type=float, default=1.0,
                   help="seconds for the children to start (more in user-mode Linux)")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--measure", type=float, default=5.0)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--cc", help="TCP congestion control of the senders (default: the "
                   "kernel's)")
    p.add_argument("--delay-us", nargs="+", type=float, default=[0.0],
                   help="one-way delay at every shaped end, microseconds (netem)")
    hostcheck.add_arguments(p)
    a = p.parse_args()
    if any(a.delay_us) and not features.netem().available:
        p.error(f"--delay-us {' '.join(f'{d:g}' for d in a.delay_us)}: this kernel has no "
                f"netem ({features.netem().detail}); run the bench in a kernel with netem, "
                "e.g. Debian's user-mode Linux (docs/network.md)")
    points = [(r, n, u) for r in a.rates for n in a.flows for u in a.loads]
    points += [(r, int(n), float(u)) for r, n, u in (x.split(":") for x in a.extra)]
    watch = hostcheck.before(a)
    runs: list[list[dict]] = []
    # SIGTERM (a `timeout`, a kill) unwinds through the finally below like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        build()
        os.environ["TCLOCK_CC"] = a.cc or ""   # the children inherit it
        cc = a.cc or sh("sysctl", "-n", "net.ipv4.tcp_congestion_control",
                        netns=ns("tcp")).strip()
        print(f"buffer {a.buffer} B, UDP bursts of {a.burst}, TCP {cc}, "
              f"{a.warmup:g} s warm-up + {a.measure:g} s, {a.runs} run(s)", flush=True)
        for run in range(a.runs):
            rows = []
            for delay_us in a.delay_us:
                for rate in dict.fromkeys(r for r, _, _ in points):
                    shape(rate, a.buffer, delay_us)
                    for r, n, u in points:
                        if r == rate:
                            # the point's own roles run below this process: the host's
                            # CPU and the other processes' say whether it measured
                            # the port or the host (its links are not sampled)
                            over = hostcheck.Watch()
                            rows.append(point(r, n, u, a, delay_us))
                            judged = hostcheck.judged(over.stop())
                            print(f"run {run + 1}: {json.dumps(rows[-1])}; "
                                  f"{hostcheck.during(judged)}", flush=True)
            runs.append(rows)
    finally:
        teardown()
    print(table(median_rows(runs) if len(runs) > 1 else runs[0]))
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
