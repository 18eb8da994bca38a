"""`tailcut decode`: a person can read one message's packets out of a capture."""

import io
import shutil
import signal
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tailcut import cli
from tailcut.transports import decode, wire
from tests.datapath.frames import udp_frame

JOB = wire.job_id("bl-decode")


def write_pcap(path: Path, frames: list[bytes], linktype: int = 1) -> None:
    out = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, linktype)
    for i, frame in enumerate(frames):
        out += struct.pack("<IIII", 1000, i * 100, len(frame), len(frame)) + frame
    path.write_bytes(out)


def message(mid: int, total: int = 1000) -> list[bytes]:
    values = np.arange(total, dtype=np.float32) / 8
    return list(wire.packets(values, job=JOB, message=mid, stride=360))


def test_the_dump_shows_every_header_field_and_what_was_delivered(tmp_path: Path) -> None:
    pkts = message(0x10001)
    frames = [udp_frame(p, 7000) for p in [pkts[2], pkts[0], pkts[0]]]
    frames.append(udp_frame(b"TCLBgarbage", 7000))
    frames += [udp_frame(p, 7000) for p in message(0x10002, total=10)]
    write_pcap(tmp_path / "c.pcap", frames)
    out = io.StringIO()
    assert decode.dump(tmp_path / "c.pcap", out) == 4
    text = out.getvalue()
    assert ("4 bounded-loss packets in 2 message(s) (one id to one receiver); 1 UDP "
            "datagrams that are not") in text
    assert "message 0x00010001 (peer 1, #1) PUSH 10.99.0.1:40000 -> 10.99.0.2:7000" in text
    assert (f"message 0x00010001 to 10.99.0.2:7000: job {JOB:#010x}, kind PUSH, total "
            "1000 elements (4000 bytes of float32)") in text
    assert "[720, 1000)" in text and "280  1152  90 90.12 90.25" in text
    assert "delivered 640/1000 elements (64.0%) in 2 distinct ranges; 1 duplicate(s)" in text
    assert "truncated: 11 bytes" in text


def test_a_message_is_chosen_by_id_and_linux_cooked_captures_are_read(tmp_path: Path) -> None:
    sll = b"\x00\x00\x00\x01\x00\x06" + bytes(8) + b"\x08\x00"
    frames = [sll + udp_frame(p, 7000)[14:] for p in message(0x20005, total=10)]
    write_pcap(tmp_path / "sll.pcap", frames, linktype=113)
    out = io.StringIO()
    decode.dump(tmp_path / "sll.pcap", out, message=0x20005)
    assert "message 0x00020005 to 10.99.0.2:7000: job" in out.getvalue()
    assert "delivered 10/10 elements (100.0%)" in out.getvalue()


def test_one_message_to_several_receivers_is_one_copy_each_not_duplicates(
        tmp_path: Path) -> None:
    # the PS sends its model to every worker under one message id
    pkts = message(0x10044, total=10)
    frames = [udp_frame(p, 7000, dst=f"10.99.0.{w}") for w in (2, 3, 4) for p in pkts]
    write_pcap(tmp_path / "ps.pcap", frames)
    out = io.StringIO()
    decode.dump(tmp_path / "ps.pcap", out, message=0x10044)
    text = out.getvalue()
    assert "in 3 message(s) (one id to one receiver)" in text
    assert "message 0x00010044 to 10.99.0.2:7000" in text
    assert "also sent to 10.99.0.3:7000, 10.99.0.4:7000" in text
    assert "delivered 10/10 elements (100.0%) in 1 distinct ranges; 0 duplicate(s)" in text
    out = io.StringIO()
    decode.dump(tmp_path / "ps.pcap", out, message=0x10044, to="10.99.0.4")
    assert "message 0x00010044 to 10.99.0.4:7000" in out.getvalue()
    out = io.StringIO()
    decode.dump(tmp_path / "ps.pcap", out, message=0x10044, to="10.99.0.9")
    assert "message 0x10044 to 10.99.0.9 is not in the capture" in out.getvalue()


def test_a_file_that_is_not_a_pcap_is_refused_clearly(tmp_path: Path, capsys) -> None:
    (tmp_path / "x.pcap").write_bytes(b"\x0a\x0d\x0d\x0a" + bytes(40))
    assert cli.main(["decode", str(tmp_path / "x.pcap")]) == 2
    assert "pcapng is not supported" in capsys.readouterr().err


def test_a_capture_without_our_packets_says_so(tmp_path: Path, capsys) -> None:
    write_pcap(tmp_path / "e.pcap", [udp_frame(b"hello", 53)])
    assert cli.main(["decode", str(tmp_path / "e.pcap")]) == 1
    assert "no bounded-loss packets (1 other UDP datagrams)" in capsys.readouterr().out


@pytest.mark.netns
@pytest.mark.bpf
@pytest.mark.skipif(shutil.which("tcpdump") is None, reason="tcpdump is not installed")
def test_a_tcpdump_capture_of_a_live_message_decodes(tmp_path: Path, capsys) -> None:
    """Capture a bounded-loss message on the receiver's interface with tcpdump."""
    from tailcut.net import netns
    from tailcut.transports.base import Kind, Message
    from tests.datapath.udp_link import IFNAME, RECEIVER_IP, build_link, remove_link
    from tests.transports.test_datagram import pair
    link = build_link("c")
    pcap = tmp_path / "live.pcap"
    try:
        with netns.entered(link.receiver):
            dump = subprocess.Popen(["tcpdump", "-i", IFNAME, "-U", "-w", str(pcap),
                                     "udp", "port", "47300"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            # tcpdump says "listening on eth0" on stderr once it captures.
            assert b"listening on" in dump.stderr.readline()
            with pair("bounded-loss", 47300, lambda: netns.entered(link.receiver),
                      lambda: netns.entered(link.sender), host=RECEIVER_IP, p=1.0,
                      job="bl-decode") as (_, s, _client, c):
                c.send(Message(Kind.PUSH, 4, 1, np.arange(2000, dtype=np.float32)), 10)
                s.recv(10)
            # Under load tcpdump can lag: wait until it has written the 6 data packets
            # (24-byte file header, then 16 + 1514 bytes or less per packet).
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and \
                    (not pcap.exists() or pcap.stat().st_size < 24 + 5 * (16 + 1514)):
                time.sleep(0.1)
        finally:
            dump.send_signal(signal.SIGINT)
            dump.wait(5)
    finally:
        remove_link(link)
    found = cli.main(["decode", str(pcap)])
    out = capsys.readouterr().out
    assert found == 0, (out, pcap.stat().st_size, dump.stderr.read().decode())
    assert "PUSH" in out and "total 2000 elements" in out
    assert "delivered 2000/2000 elements (100.0%) in 6 distinct ranges" in out
