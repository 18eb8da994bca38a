"""Which interface of this network namespace holds an address: one SIOCGIFADDR ioctl
per interface (a pod has two or three), no netlink library to import."""

from __future__ import annotations

import fcntl
import socket
import struct
from typing import Optional

SIOCGIFADDR = 0x8915


def holding(ip: str) -> Optional[str]:
    """The name of the interface that holds IPv4 address ``ip``, or None."""
    packed = socket.inet_aton(ip)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                ifreq = fcntl.ioctl(probe.fileno(), SIOCGIFADDR,
                                    struct.pack("16s16x", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address, or the interface just went away
            if ifreq[20:24] == packed:  # struct ifreq: name[16], sockaddr_in (addr at +4)
                return name
    return None


def toward(peer: str) -> tuple[Optional[str], str]:
    """(interface or None, address) this namespace reaches ``peer`` from."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((peer, 9))   # a route lookup; a UDP connect sends nothing
        address: str = probe.getsockname()[0]
    return holding(address), address
