"""Test helper: wrap a UDP payload in Ethernet + IPv4 + UDP headers, as XDP sees it."""

import struct

ETH_P_IP = 0x0800


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def udp_frame(payload: bytes, dport: int, sport: int = 40000, src: str = "10.99.0.1",
              dst: str = "10.99.0.2", udp_len: int | None = None, ihl: int = 5,
              frag_off: int = 0) -> bytes:
    """An Ethernet frame holding one UDP datagram. `udp_len` overrides the UDP length
    field (to lie about it); `ihl` > 5 adds zeroed IP options."""
    ulen = 8 + len(payload) if udp_len is None else udp_len
    udp = struct.pack("!HHHH", sport, dport, ulen, 0) + payload
    options = bytes(4 * (ihl - 5))
    ip_len = 4 * ihl + len(udp)
    ip = struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, ip_len & 0xFFFF, 0, frag_off, 64, 17, 0,
                     bytes(map(int, src.split("."))), bytes(map(int, dst.split("."))))
    ip = ip[:10] + struct.pack("!H", _checksum(ip + options)) + ip[12:]
    eth = b"\x02\x00\x00\x00\x00\x02" + b"\x02\x00\x00\x00\x00\x01" + struct.pack("!H", ETH_P_IP)
    return eth + ip + options + udp
