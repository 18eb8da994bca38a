"""Test helpers: two namespaces joined by a veth, a paced UDP sender, a counting receiver.

The link carries nothing but the test's datagrams, so the dropper's counters can be
compared with the receiver exactly: IPv6 is off (no router solicitations or MLD
reports) and both neighbours are static (no ARP).
"""

import os
import socket
import struct
import time
from dataclasses import dataclass

from tailcut.net import netns

SENDER_IP = "10.99.0.1"
RECEIVER_IP = "10.99.0.2"
IFNAME = "eth0"
NUD_PERMANENT = 0x80
PORT = 40000
SO_RCVBUFFORCE = 33  # <asm-generic/socket.h>; Python 3.11 does not export it


@dataclass(frozen=True)
class Link:
    """The sender's and the receiver's namespace; each holds one end, named IFNAME."""

    sender: str
    receiver: str


@dataclass(frozen=True)
class Traffic:
    sent: int
    received: int

    @property
    def lost(self) -> int:
        return self.sent - self.received


def _sysctl(ns: str, key: str, value: str) -> None:
    # /proc/sys/net resolves to the namespace of the thread that opens it.
    with netns.entered(ns), open(f"/proc/sys/{key.replace('.', '/')}", "w") as f:
        f.write(value)


def _mac_and_index(ns: str) -> tuple[str, int]:
    with netns.ipr(ns) as ipr:
        link = ipr.get_links(ipr.link_lookup(ifname=IFNAME)[0])[0]
        return str(link.get_attr("IFLA_ADDRESS")), int(link["index"])


def _wait_up(ns: str, timeout_s: float = 5.0) -> None:
    # The first packet after link-up can be late until both ends are operationally
    # up (PLATFORM.md), so wait for it.
    deadline = time.monotonic() + timeout_s
    with netns.ipr(ns) as ipr:
        index = ipr.link_lookup(ifname=IFNAME)[0]
        while ipr.get_links(index)[0].get_attr("IFLA_OPERSTATE") != "UP":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{IFNAME} in {ns} is not up after {timeout_s} s")
            time.sleep(0.01)


def build_link(tag: str) -> Link:
    link = Link(f"tailcut-droptest-{os.getpid()}.{tag}a",
                f"tailcut-droptest-{os.getpid()}.{tag}b")
    for ns in (link.sender, link.receiver):
        netns.create(ns)
        for scope in ("all", "default"):
            _sysctl(ns, f"net.ipv6.conf.{scope}.disable_ipv6", "1")
    with netns.ipr(link.sender) as ipr:
        ipr.link("add", ifname=IFNAME, kind="veth",
                 peer={"ifname": IFNAME, "net_ns_fd": netns.path(link.receiver)})
    ends = {link.sender: SENDER_IP, link.receiver: RECEIVER_IP}
    macs = {ns: _mac_and_index(ns) for ns in ends}
    for ns, ip in ends.items():
        other = link.receiver if ns == link.sender else link.sender
        with netns.ipr(ns) as ipr:
            index = macs[ns][1]
            ipr.addr("add", index=index, address=ip, prefixlen=24)
            ipr.link("set", index=index, state="up")
            ipr.neigh("add", dst=ends[other], lladdr=macs[other][0], ifindex=index,
                      state=NUD_PERMANENT)
    for ns in ends:
        _wait_up(ns)
    return link


def remove_link(link: Link) -> None:
    for ns in (link.sender, link.receiver):
        netns.remove(ns)


def send_udp(link: Link, count: int, burst: int = 32, payload_bytes: int = 64) -> Traffic:
    """Send `count` numbered datagrams from sender to receiver and count the distinct
    ones that arrive. Paced: after each burst the receiver is drained and the sender
    pauses, so the veth backlog (1000 packets) and the socket never overflow."""
    with netns.entered(link.receiver):
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with netns.entered(link.sender):
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    seen: set[int] = set()
    try:
        # Force a big buffer past net.core.rmem_max (we are root): a full socket
        # would be loss the dropper did not cause.
        rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
        rx.bind((RECEIVER_IP, PORT))
        rx.setblocking(False)
        pad = bytes(payload_bytes - 8)

        def drain() -> None:
            while True:
                try:
                    data = rx.recv(2048)
                except BlockingIOError:
                    return
                seen.add(struct.unpack_from("!Q", data)[0])

        for seq in range(count):
            tx.sendto(struct.pack("!Q", seq) + pad, (RECEIVER_IP, PORT))
            if seq % burst == burst - 1:
                drain()
                time.sleep(0.0002)
        deadline = time.monotonic() + 0.5  # stragglers: stop after 0.5 s of silence
        while time.monotonic() < deadline:
            before = len(seen)
            drain()
            if len(seen) != before:
                deadline = time.monotonic() + 0.5
            time.sleep(0.01)
    finally:
        rx.close()
        tx.close()
    return Traffic(sent=count, received=len(seen))


def udp_errors(ns: str) -> dict[str, int]:
    """The receiving namespace's UDP error counters from /proc/net/snmp."""
    with netns.entered(ns), open("/proc/thread-self/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Udp:")]
    stats = dict(zip(rows[0][1:], map(int, rows[1][1:]), strict=True))
    return {k: stats[k] for k in ("InErrors", "RcvbufErrors", "NoPorts")}


def link_drops(ns: str) -> int:
    """Packets the interface itself dropped, either way."""
    with netns.ipr(ns) as ipr:
        stats = ipr.get_links(ipr.link_lookup(ifname=IFNAME)[0])[0].get_attr("IFLA_STATS64")
        return int(stats["rx_dropped"]) + int(stats["tx_dropped"])
