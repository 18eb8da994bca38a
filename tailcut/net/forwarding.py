"""Turn on IPv4 forwarding for one interface, by netlink.

The spine routes between the racks, so each of its ports forwards what it receives
(Linux checks the receiving interface's `forwarding`). Writing
/proc/sys/net/ipv4/conf/<if>/forwarding would do it, but a container's /proc/sys is
read-only, and the Kubernetes node agent builds the spine from one: RTM_SETLINK with
the interface's IPv4 settings (IFLA_AF_SPEC / AF_INET / IFLA_INET_CONF) needs
CAP_NET_ADMIN only (entering the namespace takes CAP_SYS_ADMIN, as everything the
agent builds does). Only the namespace's own interface changes; the host's settings and
the namespace's `all` and `default` are left alone.
"""

import errno
import os
import socket
import struct

from tailcut.errors import NetError
from tailcut.net import netns

RTM_SETLINK = 19
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLMSG_ERROR = 2
IFLA_AF_SPEC = 26
IFLA_INET_CONF = 1
IPV4_DEVCONF_FORWARDING = 1
NLA_F_NESTED = 0x8000


def _attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def request(ifindex: int, seq: int = 1) -> bytes:
    """The RTM_SETLINK message that sets `forwarding` = 1 on interface `ifindex`."""
    conf = _attr(IPV4_DEVCONF_FORWARDING, struct.pack("=I", 1))
    spec = _attr(IFLA_AF_SPEC | NLA_F_NESTED, _attr(
        socket.AF_INET | NLA_F_NESTED, _attr(IFLA_INET_CONF | NLA_F_NESTED, conf)))
    body = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, ifindex, 0, 0) + spec
    return struct.pack("=IHHII", 16 + len(body), RTM_SETLINK, NLM_F_REQUEST | NLM_F_ACK,
                       seq, 0) + body


def enable(ns: str, ifname: str) -> None:
    """Forward what interface `ifname` of namespace `ns` receives."""
    try:
        with netns.entered(ns):   # the socket and the name lookup belong to `ns`
            index = socket.if_nametoindex(ifname)
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        with sock:
            sock.sendall(request(index))
            reply = sock.recv(65536)
    except OSError as err:
        raise NetError(f"{ns}/{ifname}: cannot turn on IPv4 forwarding: {err}") from err
    kind, = struct.unpack_from("=H", reply, 4)
    code, = struct.unpack_from("=i", reply, 16) if kind == NLMSG_ERROR else (0,)
    if code != 0:
        raise NetError(f"{ns}/{ifname}: cannot turn on IPv4 forwarding: "
                       f"{os.strerror(-code)} ({errno.errorcode.get(-code, code)})")
