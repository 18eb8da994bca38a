"""App-drop: the sender keeps a random fraction p of every vector; the rest is masked."""

import socket

import numpy as np
import pytest

from tailcut import transports
from tailcut.transports import app_drop, base, tcp
from tailcut.transports.base import Kind, Message
from tests.transports.test_datagram import pair

VECTOR = np.random.default_rng(2).standard_normal(10_001).astype(np.float32)


def test_the_receiver_gets_exactly_ceil_p_n_coordinates_and_their_true_values() -> None:
    with pair("app-drop", 27401, p=0.7, seed=1) as (_, s, _client, c):
        for i in range(3):
            c.send(Message(Kind.PUSH, i, 0, VECTOR))
            msg = s.recv(10)
            assert msg.mask is not None and msg.mask.sum() == 7001
            assert np.array_equal(msg.values[msg.mask], VECTOR[msg.mask])
            assert np.all(msg.values[~msg.mask] == 0)
            # fewer bytes on the wire: 7001 floats + 1251 bytes of mask, not 10001 floats
            assert msg.wire_bytes == tcp.HEADER.size + 4 * 7001 + 4 + 1251


def test_p_of_one_delivers_everything_without_a_mask() -> None:
    with pair("app-drop", 27402, p=1.0) as (_, s, _client, c):
        c.send(Message(Kind.PARAMS, 0, -1, VECTOR))
        msg = s.recv(10)
        assert msg.mask is None and np.array_equal(msg.values, VECTOR)


def test_hello_and_stop_are_plain_frames() -> None:
    with pair("app-drop", 27403, p=0.5) as (_, s, _client, c):
        c.send(Message(Kind.HELLO, 0, 2))
        assert s.recv(10).kind == Kind.HELLO


def test_a_trailer_that_disagrees_with_the_frame_is_a_protocol_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        raw = socket.create_connection(listener.getsockname())
        conn_sock, _ = listener.accept()
    conn = app_drop.AppDropConnection(tcp.TcpConnection(conn_sock, "peer", 1000), 0.5,
                                      np.random.default_rng(0))
    try:
        frame = tcp.encode(Message(Kind.PUSH, 0, 0, np.ones(3, np.float32)))
        raw.sendall(frame + app_drop.TOTAL.pack(8) + bytes([0b1111]))  # keeps 4, carries 3
        with pytest.raises(base.ProtocolError, match="mask keeps 4 coordinates, the frame "
                                                     "carries 3"):
            conn.recv(5)
    finally:
        raw.close()
        conn.close()


@pytest.mark.parametrize("p", [0, 1.5, -1, True])
def test_p_outside_zero_one_is_refused_naming_p(p: object) -> None:
    with pytest.raises(ValueError, match=r"p=.*must be a fraction in \(0, 1\]"):
        transports.get("app-drop", p=p)


def test_tagging_an_app_drop_connection_for_cadentflow_is_refused_by_name() -> None:
    from tailcut.training import flows
    with pair("app-drop", 27404, p=0.5) as (_, s, _client, c):
        with pytest.raises(base.TransportError, match="app-drop connection .* cannot send "
                                                      "tagged per-tensor messages"):
            flows.tag(c, Kind.PUSH, (base.Cut(0, VECTOR.size, 0),))
        c.send(Message(Kind.PUSH, 0, 0, VECTOR))  # and it still sends, untagged
        assert s.recv(10).mask is not None
