"""Batched rtnetlink requests, encoded here with struct: many in one sendmsg(2).

pyroute2 spends about a millisecond of Python on each request it encodes, sends and
decodes. A 1,000-pod job pins ~32,000 neighbour entries and wires 2,000 link ends, so
the network builder's requests go through here instead (veths, addresses, routes,
neighbours, link deletion; tc trees and droppers as pyroute2 encodes them, without its
socket, see `raw` and `encoded`): a Batch collects the messages for one namespace, `send` writes them in a few sendmsg calls (rtnetlink handles each call's
messages synchronously, in order, before the call returns) and then reads the replies.
Only failures are answered (no NLM_F_ACK), so the kernel queues nothing on success;
every failure is reported with its errno, apart from the errnos the caller tolerates.

The message layouts (include/uapi/linux/{netlink,rtnetlink,neighbour,if_link}.h):

    nlmsghdr  u32 len, u16 type, u16 flags, u32 seq, u32 pid
    ndmsg     u8 family, 3 pad, s32 ifindex, u16 state, u8 flags, u8 type
    ifinfomsg u8 family, 1 pad, u16 type, s32 index, u32 flags, u32 change
    ifaddrmsg u8 family, u8 prefixlen, u8 flags, u8 scope, u32 index
    rtmsg     u8 family, dst_len, src_len, tos, table, protocol, scope, type; u32 flags
    attribute u16 len, u16 type, payload padded to 4 bytes
"""

import errno
import os
import socket
import struct
from collections.abc import Iterable

from tailcut.errors import NetError
from tailcut.net import netns

RTM_NEWLINK, RTM_DELLINK, RTM_NEWADDR, RTM_NEWROUTE, RTM_NEWNEIGH = 16, 17, 20, 24, 28
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE = 0x100, 0x200, 0x400
NLA_F_NESTED = 0x8000
IFLA_IFNAME = 3
IFLA_ADDRESS, IFLA_MTU, IFLA_MASTER, IFLA_LINKINFO, IFLA_IFALIAS = 1, 4, 10, 18, 20
IFLA_NET_NS_FD, IFLA_GSO_MAX_SEGS, IFLA_GSO_MAX_SIZE = 28, 40, 41
IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER = 1, 2, 1
IFA_ADDRESS, IFA_LOCAL, IFA_BROADCAST = 1, 2, 4
RTA_DST, RTA_GATEWAY = 1, 5
RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE, RTN_UNICAST = 254, 3, 0, 1
NLMSG_ERROR = 2
NDA_DST, NDA_LLADDR = 1, 2
IFLA_GROUP = 27
IFF_UP = 0x1
NUD_PERMANENT = 0x80
SEND_BYTES = 32_768        # per sendmsg: well inside the socket's send buffer


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _mac(text: str) -> bytes:
    return bytes(int(b, 16) for b in text.split(":"))


class Batch:
    """Requests for one network namespace, sent together by `send`."""

    def __init__(self) -> None:
        self._messages: list[tuple[bytes, str]] = []   # (message body, what it does)

    def __len__(self) -> int:
        return len(self._messages)

    def _add(self, kind: int, flags: int, body: bytes, what: str) -> None:
        self._messages.append((struct.pack("=HH", kind, NLM_F_REQUEST | flags) + body, what))

    def raw(self, kind: int, flags: int, body: bytes, what: str) -> None:
        """A request encoded elsewhere: its type, flags and what follows the header."""
        self._messages.append((struct.pack("=HH", kind, flags | NLM_F_REQUEST) + body, what))

    def veth_add(self, ifname: str, peer: str, peer_ns_fd: int, *, mtu: int, group: int,
                 master: int, peer_mac: str) -> None:
        """A veth pair, both ends in interface `group` and down (asking for up here
        fails with ENOTCONN: set_link them up): `ifname` here, a port of bridge
        `master`; `peer` (MAC `peer_mac`) in the namespace open at `peer_ns_fd`."""
        peer_info = (struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0)
                     + _attr(IFLA_IFNAME, peer.encode() + b"\0")
                     + _attr(IFLA_NET_NS_FD, struct.pack("=I", peer_ns_fd))
                     + _attr(IFLA_MTU, struct.pack("=I", mtu))
                     + _attr(IFLA_ADDRESS, _mac(peer_mac))
                     + _attr(IFLA_GROUP, struct.pack("=I", group)))
        info = _attr(IFLA_INFO_KIND, b"veth\0") + _attr(
            IFLA_INFO_DATA | NLA_F_NESTED, _attr(VETH_INFO_PEER | NLA_F_NESTED, peer_info))
        body = (struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0)
                + _attr(IFLA_IFNAME, ifname.encode() + b"\0")
                + _attr(IFLA_MTU, struct.pack("=I", mtu))
                + _attr(IFLA_GROUP, struct.pack("=I", group))
                + _attr(IFLA_MASTER, struct.pack("=I", master))
                + _attr(IFLA_LINKINFO | NLA_F_NESTED, info))
        self._add(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body,
                  f"veth {ifname} (peer {peer})")

    def set_link(self, ifindex: int, *, alias: str | None = None, up: bool = False,
                 gso_max_segs: int | None = None, gso_max_size: int | None = None) -> None:
        """Change link `ifindex`: its alias, up, its largest GSO packet in segments
        and in bytes."""
        attrs = b""
        if alias is not None:
            attrs += _attr(IFLA_IFALIAS, alias.encode() + b"\0")
        if gso_max_segs is not None:
            attrs += _attr(IFLA_GSO_MAX_SEGS, struct.pack("=I", gso_max_segs))
        if gso_max_size is not None:
            attrs += _attr(IFLA_GSO_MAX_SIZE, struct.pack("=I", gso_max_size))
        flag = IFF_UP if up else 0
        body = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, ifindex, flag, flag) + attrs
        self._add(RTM_NEWLINK, 0, body, f"set ifindex {ifindex}")

    def addr_add(self, ifindex: int, ip: str, prefixlen: int) -> None:
        addr = socket.inet_aton(ip)
        host_bits = (1 << (32 - prefixlen)) - 1
        broadcast = struct.pack("!I", struct.unpack("!I", addr)[0] | host_bits)
        body = (struct.pack("=BBBBI", socket.AF_INET, prefixlen, 0, 0, ifindex)
                + _attr(IFA_LOCAL, addr) + _attr(IFA_ADDRESS, addr)
                + _attr(IFA_BROADCAST, broadcast))
        self._add(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, body,
                  f"address {ip}/{prefixlen} on ifindex {ifindex}")

    def route_add(self, dst: str, gateway: str) -> None:
        """A route to `dst` ("0.0.0.0/0" or "a.b.c.d/n") through `gateway`."""
        net, _, length = dst.partition("/")
        prefix = int(length or 32)
        body = (struct.pack("=BBBBBBBBI", socket.AF_INET, prefix, 0, 0, RT_TABLE_MAIN,
                            RTPROT_BOOT, RT_SCOPE_UNIVERSE, RTN_UNICAST, 0)
                + (_attr(RTA_DST, socket.inet_aton(net)) if prefix else b"")
                + _attr(RTA_GATEWAY, socket.inet_aton(gateway)))
        self._add(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, body,
                  f"route {dst} via {gateway}")

    def encoded(self, data: bytes, what: str) -> None:
        """Whole messages encoded elsewhere (pyroute2's IPBatch), without their acks."""
        offset = 0
        while offset < len(data):
            length, kind, flags = struct.unpack_from("=IHH", data, offset)
            self.raw(kind, flags & ~NLM_F_ACK, data[offset + 16:offset + length], what)
            offset += (length + 3) & ~3

    def neigh_replace(self, ifindex: int, ip: str, mac: str) -> None:
        """A permanent IPv4 neighbour entry: `ip` is at `mac` on interface `ifindex`."""
        body = (struct.pack("=BxxxiHBB", socket.AF_INET, ifindex, NUD_PERMANENT, 0, 0)
                + _attr(NDA_DST, socket.inet_aton(ip)) + _attr(NDA_LLADDR, _mac(mac)))
        self._add(RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE, body,
                  f"neighbour {ip} lladdr {mac} on ifindex {ifindex}")

    def delete_group(self, group: int) -> None:
        """Delete every link of interface group `group` (`ip link delete group N`)."""
        body = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0) + _attr(
            IFLA_GROUP, struct.pack("=I", group))
        self._add(RTM_DELLINK, 0, body, f"delete the links of group {group}")

    def delete_link(self, ifindex: int) -> None:
        body = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, ifindex, 0, 0)
        self._add(RTM_DELLINK, 0, body, f"delete ifindex {ifindex}")

    def send(self, sock: socket.socket, tolerate: Iterable[int] = ()) -> None:
        """Send every request on `sock` (a NETLINK_ROUTE socket in the namespace); raise
        NetError for the first failure whose errno is not in `tolerate`."""
        messages, self._messages = self._messages, []
        failures: list[tuple[int, int]] = []   # (seq, errno)
        chunk: list[bytes] = []
        size = 0
        for seq, (body, _) in enumerate(messages):
            msg = struct.pack("=I", 12 + len(body)) + body[:4] + struct.pack("=II", seq, 0) \
                + body[4:]
            if size + len(msg) > SEND_BYTES:
                self._flush(sock, chunk, failures)
                chunk, size = [], 0
            chunk.append(msg)
            size += len(msg)
        if chunk:
            self._flush(sock, chunk, failures)
        ignored = set(tolerate)
        for seq, code in failures:
            if code not in ignored:
                raise NetError(f"{messages[seq][1]}: {os.strerror(code)} "
                               f"({errno.errorcode.get(code, code)})")

    @staticmethod
    def _flush(sock: socket.socket, chunk: list[bytes],
               failures: list[tuple[int, int]]) -> None:
        sock.sendall(b"".join(chunk))
        while True:   # the kernel has answered by now: only failures are queued
            try:
                data = sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            offset = 0
            while offset + 16 <= len(data):
                length, kind, _, seq, _ = struct.unpack_from("=IHHII", data, offset)
                if kind == NLMSG_ERROR:
                    code, = struct.unpack_from("=i", data, offset + 16)
                    if code:
                        failures.append((seq, -code))
                offset += max(16, (length + 3) & ~3)


def ifindex(sock: socket.socket, name: str) -> int:
    """The index of interface `name` in the socket's namespace."""
    sock.sendall(_request(
        RTM_GETLINK, struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0)
        + _attr(IFLA_IFNAME, name.encode() + b"\0")))
    data = sock.recv(65536)
    kind, = struct.unpack_from("=H", data, 4)
    if kind == NLMSG_ERROR:
        code, = struct.unpack_from("=i", data, 16)
        raise NetError(f"no interface {name}: {os.strerror(-code)}")
    index, = struct.unpack_from("=i", data, 20)
    return int(index)


def _request(kind: int, body: bytes, flags: int = 0) -> bytes:
    return struct.pack("=IHHII", 16 + len(body), kind, NLM_F_REQUEST | flags, 1, 0) + body


def socket_in(ns: str) -> socket.socket:
    """A NETLINK_ROUTE socket bound inside namespace `ns` (it stays there)."""
    with netns.entered(ns):
        return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)


def send_in(ns: str, batch: Batch, tolerate: Iterable[int] = ()) -> None:
    """Send `batch` in namespace `ns` on a socket of its own."""
    if not len(batch):
        return
    with socket_in(ns) as sock:
        batch.send(sock, tolerate)


RTM_GETLINK = 18
NLM_F_DUMP = 0x300
NLMSG_DONE = 3
IFLA_PROTINFO, IFLA_OPERSTATE = 12, 16
IFLA_BRPORT_STATE = 1
AF_BRIDGE = 7
NLA_TYPE_MASK = 0x3FFF
OPERSTATES = {0: "UNKNOWN", 1: "NOTPRESENT", 2: "DOWN", 3: "LOWERLAYERDOWN", 4: "TESTING",
              5: "DORMANT", 6: "UP"}


def parse_attrs(data: bytes, offset: int, end: int) -> dict[int, bytes]:
    out = {}
    while offset + 4 <= end:
        length, kind = struct.unpack_from("=HH", data, offset)
        if length < 4:
            break
        out[kind & NLA_TYPE_MASK] = data[offset + 4:offset + length]
        offset += (length + 3) & ~3
    return out


def link_states(sock: socket.socket) -> list[tuple[str, str, int | None]]:
    """Every link of the socket's namespace: (name, operational state as `ip link`
    names it, bridge port state or None if it is no bridge port)."""
    ports = {name: port for name, _, port in _dump_links(sock, AF_BRIDGE)}
    return [(name, oper, ports.get(name)) for name, oper, _ in
            _dump_links(sock, socket.AF_UNSPEC)]


def _dump_links(sock: socket.socket, family: int) -> list[tuple[str, str, int | None]]:
    """RTM_GETLINK dump; AF_BRIDGE lists the bridge ports with their port state."""
    sock.sendall(struct.pack("=IHHII", 32, RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
                 + struct.pack("=BxHiII", family, 0, 0, 0, 0))
    out: list[tuple[str, str, int | None]] = []
    while True:
        data = sock.recv(1 << 20)
        offset = 0
        while offset + 16 <= len(data):
            length, kind, _, _, _ = struct.unpack_from("=IHHII", data, offset)
            if kind == NLMSG_DONE:
                return out
            if kind == NLMSG_ERROR:
                code, = struct.unpack_from("=i", data, offset + 16)
                raise NetError(f"listing links: {os.strerror(-code)}")
            attrs = parse_attrs(data, offset + 32, offset + length)
            name = attrs.get(IFLA_IFNAME, b"").rstrip(b"\0").decode()
            oper = OPERSTATES.get(attrs.get(IFLA_OPERSTATE, b"\0")[0], "UNKNOWN")
            port = None
            if IFLA_PROTINFO in attrs:
                nested = parse_attrs(attrs[IFLA_PROTINFO], 0, len(attrs[IFLA_PROTINFO]))
                if IFLA_BRPORT_STATE in nested:
                    port = nested[IFLA_BRPORT_STATE][0]
            out.append((name, oper, port))
            offset += (length + 3) & ~3
