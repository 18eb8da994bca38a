"""Where UDP GSO messages are cut into datagrams.

A bounded-loss sender hands the kernel up to 64 KiB of datagrams at once (UDP GSO,
tailcut.transports.batch), as a TCP sender does with its segments; on veths and bridges
such a message travels whole until an interface that cannot carry it cuts it. The XDP
counter in generic mode, which is the default, would see a whole message as one
packet, so every switch port facing a pod cuts UDP GSO messages there, on its way out:
the pod then receives one datagram per wire packet, and the fabric before it carries
64 KiB at a time. TCP's segmentation offload is untouched (a separate feature).

The feature is set with the SIOCETHTOOL ioctl (what `ethtool -K PORT
tx-udp-segmentation off` does), one call per port on a socket of the port's namespace:
~10 us a port, where pyroute2's Ethtool took ~1.3 ms (it reads every feature first).
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import socket
import struct

from tailcut.errors import NetError
from tailcut.net import netns

UDP_SEGMENTATION = "tx-udp-segmentation"

SIOCETHTOOL = 0x8946
ETHTOOL_GSTRINGS = 0x1B
ETHTOOL_GFEATURES = 0x3A
ETHTOOL_SFEATURES = 0x3B
ETHTOOL_GSSET_INFO = 0x37
ETH_SS_FEATURES = 4
ETH_GSTRING_LEN = 32


def _ethtool(sock: socket.socket, ifname: str, data: ctypes.Array[ctypes.c_char]) -> None:
    """One SIOCETHTOOL request on `ifname` with `data` (the command's struct)."""
    ifreq = struct.pack("16sP", ifname.encode(), ctypes.addressof(data))
    fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifreq)


@functools.cache
def _feature_bit(name: str) -> int:
    """The kernel's index of feature `name` (the same for every device: the names
    are the kernel's netdev feature table, read once per process from lo)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        info = ctypes.create_string_buffer(struct.pack("IIQI", ETHTOOL_GSSET_INFO, 0,
                                                       1 << ETH_SS_FEATURES, 0))
        _ethtool(sock, "lo", info)
        count = struct.unpack_from("I", info, 16)[0]
        strings = ctypes.create_string_buffer(12 + count * ETH_GSTRING_LEN)
        struct.pack_into("III", strings, 0, ETHTOOL_GSTRINGS, ETH_SS_FEATURES, count)
        _ethtool(sock, "lo", strings)
    names = [strings.raw[12 + i * ETH_GSTRING_LEN:12 + (i + 1) * ETH_GSTRING_LEN]
             .split(b"\0", 1)[0].decode() for i in range(count)]
    return names.index(name)


def _blocks() -> int:
    return _feature_bit(UDP_SEGMENTATION) // 32 + 1


def cut_udp_gso_at(ns: str, ifnames: list[str]) -> None:
    """Make interfaces `ifnames` of namespace `ns` cut UDP GSO messages into datagrams."""
    bit = _feature_bit(UDP_SEGMENTATION)
    blocks = _blocks()
    request = ctypes.create_string_buffer(8 + 8 * blocks)
    # valid: the one feature this request changes; requested: off.
    struct.pack_into("II", request, 0, ETHTOOL_SFEATURES, blocks)
    struct.pack_into("II", request, 8 + 8 * (bit // 32), 1 << (bit % 32), 0)
    with netns.entered(ns), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for ifname in ifnames:
            try:
                _ethtool(sock, ifname, request)
            except OSError as err:
                raise NetError(f"{ns}/{ifname}: cannot turn {UDP_SEGMENTATION} "
                                        f"off: {err.strerror}") from err


def cuts_udp_gso(ns: str, ifname: str) -> bool:
    """Whether `ifname` in `ns` cuts UDP GSO messages (for tests and `tailcut doctor`)."""
    bit = _feature_bit(UDP_SEGMENTATION)
    blocks = _blocks()
    # struct ethtool_gfeatures: cmd, size, then per block available, requested,
    # active, never_changed.
    reply = ctypes.create_string_buffer(8 + 16 * blocks)
    struct.pack_into("II", reply, 0, ETHTOOL_GFEATURES, blocks)
    with netns.entered(ns), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        _ethtool(sock, ifname, reply)
    active = struct.unpack_from("I", reply, 8 + 16 * (bit // 32) + 8)[0]
    return not active & (1 << (bit % 32))
