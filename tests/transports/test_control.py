"""The datagram transports' control channel: frames round trip, bad bytes are named."""

import socket

import pytest

from tailcut.transports import base, control
from tailcut.transports.control import Frame, FrameType


def channels() -> tuple[socket.socket, control.Channel]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        raw = socket.create_connection(listener.getsockname())
        sock, _ = listener.accept()
    return raw, control.Channel(sock, "peer")


def test_a_frame_round_trips_with_its_extra_bytes() -> None:
    raw, ch = channels()
    try:
        f = Frame(FrameType.NACK, 2, 0x10003, -4, -1, 3, 123456789, b"\0\0\0\1" * 3)
        raw.sendall(f.encode())
        assert ch.read() == f
    finally:
        raw.close()
        ch.close()


def test_a_begin_carries_its_senders_start_rate_and_no_other_frame_does() -> None:
    raw, ch = channels()
    try:
        f = Frame(FrameType.BEGIN, 1, 0x10003, 4, 0, 5000, 1, rate_mbit=65535)
        raw.sendall(f.encode())
        assert ch.read() == f
        raw.sendall(Frame(FrameType.DONE, message=1, rate_mbit=1000).encode())
        with pytest.raises(base.ProtocolError, match="reserved field 1000"):
            ch.read()
    finally:
        raw.close()
        ch.close()


def test_the_rto_floor_is_set_where_the_kernel_has_it() -> None:
    raw, ch = channels()
    try:
        assert ch.rto_min_us is None or ch.rto_min_us < 200_000
    finally:
        raw.close()
        ch.close()


@pytest.mark.parametrize("data,words", [
    (b"XXXX" + bytes(32), "magic b'XXXX'"),
    (Frame(FrameType.DONE).encode()[:4] + b"\x09" + bytes(31), "unknown control frame type 9"),
    (control.HEADER.pack(control.MAGIC, 6, 0, 1, 0, 0, 0, 0, 0, 0), "reserved field 1"),
    (control.HEADER.pack(control.MAGIC, 5, 0, 0, 0, 0, 0, 0, 0, 1 << 20), "extra 1048576"),
    (Frame(FrameType.NACK, extra=b"abcd").encode()[:-2], "cut short"),
])
def test_bad_frames_are_protocol_errors_naming_what_is_wrong(data: bytes, words: str) -> None:
    raw, ch = channels()
    try:
        raw.sendall(data)
        raw.shutdown(socket.SHUT_WR)
        with pytest.raises(base.ProtocolError, match=words.replace("(", r"\(")):
            ch.read()
    finally:
        raw.close()
        ch.close()


def test_a_clean_close_is_peer_closed() -> None:
    raw, ch = channels()
    raw.close()
    with pytest.raises(base.PeerClosed):
        ch.read()
    ch.close()
