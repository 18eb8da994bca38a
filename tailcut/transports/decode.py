"""Read bounded-loss packets out of a pcap file and print one message for a person.

``tailcut decode capture.pcap`` lists the messages in a capture and dumps the packets
of one (the first, or ``--message ID``): header fields, the range each packet holds,
its size and first values, then what was delivered. Captures come from tcpdump
(classic pcap; Ethernet, Linux cooked v1/v2 or raw IP link types), e.g.

    ip netns exec tailcut-quick.ps-0 tcpdump -i eth0 -w ps.pcap udp port 7000
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from tailcut.transports import base, wire

_PCAP_MAGIC = {b"\xd4\xc3\xb2\xa1": ("<", 1e-6), b"\xa1\xb2\xc3\xd4": (">", 1e-6),
               b"\x4d\x3c\xb2\xa1": ("<", 1e-9), b"\xa1\xb2\x3c\x4d": (">", 1e-9)}
# Link types (pcap LINKTYPE_*) and the bytes before the IP header, found how.
_ETHERNET, _RAW, _LINUX_SLL, _LINUX_SLL2 = 1, 101, 113, 276


class PcapError(ValueError):
    """The file is not a classic pcap this reader understands; says why."""


@dataclass(frozen=True)
class Datagram:
    """One UDP datagram of a capture."""

    time_s: float
    src: str
    dst: str
    sport: int
    dport: int
    payload: bytes


def read_pcap(path: Path) -> Iterator[tuple[float, int, bytes]]:
    """(timestamp, link type, frame bytes) of every record of a classic pcap file."""
    data = path.read_bytes()
    if len(data) < 24 or data[:4] not in _PCAP_MAGIC:
        raise PcapError(f"{path}: not a classic pcap file (pcapng is not supported; "
                        "write captures with tcpdump -w, or convert with editcap -F pcap)")
    order, unit = _PCAP_MAGIC[data[:4]]
    linktype = struct.unpack_from(order + "I", data, 20)[0]
    pos = 24
    while pos + 16 <= len(data):
        sec, frac, caplen, _ = struct.unpack_from(order + "IIII", data, pos)
        pos += 16
        if pos + caplen > len(data):
            break  # a capture cut off mid-record: stop at the last whole one
        yield sec + frac * unit, linktype, data[pos:pos + caplen]
        pos += caplen


def _ip_offset(linktype: int, frame: bytes) -> int | None:
    """Where the IPv4 header starts in ``frame``, or None if the frame is not IPv4."""
    if linktype == _ETHERNET:
        if len(frame) < 14:
            return None
        off, ethertype = 14, struct.unpack_from("!H", frame, 12)[0]
        if ethertype == 0x8100 and len(frame) >= 18:  # one VLAN tag
            off, ethertype = 18, struct.unpack_from("!H", frame, 16)[0]
        return off if ethertype == 0x0800 else None
    if linktype == _LINUX_SLL:
        return 16 if len(frame) >= 16 and frame[14:16] == b"\x08\x00" else None
    if linktype == _LINUX_SLL2:
        return 20 if len(frame) >= 20 and frame[0:2] == b"\x08\x00" else None
    if linktype == _RAW:
        return 0
    return None


def udp_datagrams(path: Path) -> Iterator[Datagram]:
    """Every IPv4 UDP datagram in the capture (others are skipped)."""
    for ts, linktype, frame in read_pcap(path):
        off = _ip_offset(linktype, frame)
        if off is None or len(frame) < off + 20 or frame[off] >> 4 != 4:
            continue
        ihl = (frame[off] & 0x0F) * 4
        if frame[off + 9] != 17 or ihl < 20 or len(frame) < off + ihl + 8:
            continue
        src = ".".join(map(str, frame[off + 12:off + 16]))
        dst = ".".join(map(str, frame[off + 16:off + 20]))
        sport, dport, ulen = struct.unpack_from("!HHH", frame, off + ihl)
        udp = off + ihl
        yield Datagram(ts, src, dst, sport, dport, frame[udp + 8:udp + max(ulen, 8)])


def _kind(k: int) -> str:
    try:
        return base.Kind(k).name
    except ValueError:
        return str(k)


def dump(path: Path, out: TextIO, message: int | None = None, port: int | None = None,
         values: int = 3, to: str | None = None) -> int:
    """Print the messages of capture ``path`` and the packets of one; return how many
    bounded-loss packets it held. A message is one id to one receiver: the PS sends
    its model to every worker under one id, and each copy is listed and dumped apart
    (``to``: the receiver's address, or address:port, of the copy to dump)."""
    good: list[tuple[Datagram, wire.Packet]] = []
    bad: list[tuple[Datagram, str]] = []
    for d in udp_datagrams(path):
        if port is not None and d.dport != port:
            continue
        try:
            good.append((d, wire.parse(d.payload)))
        except wire.BadPacket as err:
            bad.append((d, str(err)))
    if not good:
        print(f"{path}: no bounded-loss packets"
              + (f" to port {port}" if port else "")
              + f" ({len(bad)} other UDP datagrams)", file=out)
        return 0
    copies: dict[tuple[int, str], list[tuple[Datagram, wire.Packet]]] = {}
    for d, pkt in good:
        copies.setdefault((pkt.message, f"{d.dst}:{d.dport}"), []).append((d, pkt))
    print(f"{path}: {len(good)} bounded-loss packets in {len(copies)} message(s) "
          f"(one id to one receiver); {len(bad)} UDP datagrams that are not", file=out)
    for (mid, _), pkts in copies.items():
        d, p = pkts[0]
        print(f"  message {mid:#010x} (peer {mid >> 16}, #{mid & 0xFFFF}) {_kind(p.kind)} "
              f"{d.src}:{d.sport} -> {d.dst}:{d.dport}  {len(pkts)} packets, "
              f"total {p.total} elements", file=out)
    chosen = next(iter(copies))[0] if message is None else message
    matching = [key for key in copies if key[0] == chosen
                and (to is None or to in (key[1], key[1].rpartition(":")[0]))]
    if not matching:
        print(f"message {chosen:#x}" + (f" to {to}" if to else "")
              + " is not in the capture", file=out)
        return len(good)
    pkts = copies[matching[0]]
    t0 = pkts[0][0].time_s
    first = pkts[0][1]
    print(f"\nmessage {chosen:#010x} to {matching[0][1]}: job {first.job:#010x}, kind "
          f"{_kind(first.kind)}, total {first.total} elements ({first.total * 4} bytes "
          f"of float32)", file=out)
    if len(matching) > 1:
        print(f"  (also sent to {', '.join(key[1] for key in matching[1:])}: --to ADDRESS "
              "dumps another copy)", file=out)
    print(f"  {'time_ms':>9} {'seq':>6} {'flags':<9} {'range [start, end)':<22} "
          f"{'elems':>5} {'bytes':>5}  first values", file=out)
    seen: set[tuple[int, int]] = set()
    dups = retx = 0
    for d, p in pkts:
        rng = f"[{p.start}, {p.end})"
        head = " ".join(f"{v:.4g}" for v in p.values[:values])
        print(f"  {1e3 * (d.time_s - t0):9.3f} {p.seq:6d} {wire.describe_flags(p.flags):<9} "
              f"{rng:<22} {p.elements:5d} {len(d.payload):5d}  {head}", file=out)
        key = (p.start, p.end)
        dups += key in seen
        retx += bool(p.flags & wire.F_RETX)
        seen.add(key)
    delivered = sum(e - s for s, e in seen)
    print(f"  delivered {delivered}/{first.total} elements "
          f"({100 * delivered / first.total:.1f}%) in {len(seen)} distinct ranges; "
          f"{dups} duplicate(s), {retx} retransmission(s)", file=out)
    if bad:
        print(f"\n{len(bad)} UDP datagram(s) rejected by the parser, e.g.:", file=out)
        for d, why in bad[:5]:
            print(f"  {d.src}:{d.sport} -> {d.dst}:{d.dport} {len(d.payload)} bytes: {why}",
                  file=out)
    return len(good)
