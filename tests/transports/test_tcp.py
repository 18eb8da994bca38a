"""Tests of the TCP transport: framing round trips, rejected frames, listen/connect."""

import socket
import struct
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tailcut.transports import base, tcp
from tailcut.transports.base import Kind, Message


def _socket_pair() -> tuple[socket.socket, socket.socket]:
    """Two ends of a real loopback TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    return client, server


@pytest.fixture
def pair() -> Iterator[tuple[tcp.TcpConnection, tcp.TcpConnection]]:
    a, b = _socket_pair()
    left = tcp.TcpConnection(a, "left", tcp.DEFAULT_MAX_ELEMENTS)
    right = tcp.TcpConnection(b, "right", tcp.DEFAULT_MAX_ELEMENTS)
    yield left, right
    left.close()
    right.close()


@pytest.fixture
def raw() -> Iterator[tuple[socket.socket, tcp.TcpConnection]]:
    """A raw socket to write arbitrary bytes into, and the connection reading them."""
    a, b = _socket_pair()
    conn = tcp.TcpConnection(b, "raw-peer", max_elements=1000)
    yield a, conn
    a.close()
    conn.close()


def _header(
    magic: bytes = tcp.MAGIC,
    version: int = tcp.VERSION,
    kind: int = 2,
    flags: int = 0,
    count: int = 3,
) -> bytes:
    return tcp.HEADER.pack(magic, version, kind, flags, 7, 1, count, 123)


def test_a_push_round_trips_with_kind_iteration_sender_values_and_timing(
    pair: tuple[tcp.TcpConnection, tcp.TcpConnection],
) -> None:
    left, right = pair
    values = np.random.default_rng(0).normal(size=64714).astype(np.float32)
    before = time.time_ns()
    left.send(Message(Kind.PUSH, 41, 3, values))
    got = right.recv(timeout_s=5)
    assert (got.kind, got.iteration, got.sender, got.mask) == (Kind.PUSH, 41, 3, None)
    np.testing.assert_array_equal(got.values, values)
    assert before <= got.sent_at_ns <= got.received_at_ns <= time.time_ns()
    assert got.wire_bytes == tcp.HEADER.size + 4 * 64714
    assert got.completion_s >= 0


def test_an_explicit_sent_at_ns_is_kept_and_empty_messages_round_trip(
    pair: tuple[tcp.TcpConnection, tcp.TcpConnection],
) -> None:
    left, right = pair
    left.send(Message(Kind.STOP, 9, base.PS_SENDER, sent_at_ns=12345))
    got = right.recv(timeout_s=5)
    assert (got.kind, got.iteration, got.sender, got.sent_at_ns, got.values.size) == (
        Kind.STOP,
        9,
        -1,
        12345,
        0,
    )


def test_a_mask_round_trips_and_counts_the_missing_coordinates(
    pair: tuple[tcp.TcpConnection, tcp.TcpConnection],
) -> None:
    left, right = pair
    mask = np.array([True, False, True, True, False, False, True, True, True, False, True])
    left.send(Message(Kind.PARAMS, 0, -1, np.arange(11, dtype=np.float32), mask))
    got = right.recv(timeout_s=5)
    assert got.mask is not None
    np.testing.assert_array_equal(got.mask, mask)
    assert got.missing == 4
    assert got.wire_bytes == tcp.HEADER.size + 44 + 2


@settings(max_examples=50, deadline=None)
@given(
    values=hnp.arrays(np.float32, st.integers(0, 300)),
    iteration=st.integers(-(2**31), 2**31 - 1),
    sender=st.integers(-(2**31), 2**31 - 1),
    with_mask=st.booleans(),
)
def test_any_message_round_trips_bit_for_bit(
    values: np.ndarray, iteration: int, sender: int, with_mask: bool
) -> None:
    a, b = _socket_pair()
    with tcp.TcpConnection(a, "a", 1000) as left, tcp.TcpConnection(b, "b", 1000) as right:
        mask = (np.arange(values.size) % 3 == 0) if with_mask else None
        left.send(Message(Kind.PUSH, iteration, sender, values, mask))
        got = right.recv(timeout_s=5)
    assert got.values.tobytes() == values.tobytes()  # NaN payloads included
    assert (got.iteration, got.sender) == (iteration, sender)
    assert (got.mask is None) == (mask is None)
    if mask is not None:
        np.testing.assert_array_equal(got.mask, mask)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (_header(magic=b"HTTP"), "bad magic b'HTTP'"),
        (_header(version=9), "protocol version 9"),
        (_header(kind=0), "unknown message kind 0"),
        (_header(flags=0x80), "unknown flag bits 0x80"),
        (_header(count=1001), "element count 1001 .* exceeds max_elements=1000"),
        (_header(count=2**32 - 1), "element count 4294967295"),
    ],
    ids=["magic", "version", "kind", "flags", "count-over-cap", "count-huge"],
)
def test_a_bad_header_raises_a_protocol_error_saying_what_was_wrong(
    raw: tuple[socket.socket, tcp.TcpConnection], header: bytes, message: str
) -> None:
    writer, conn = raw
    writer.sendall(header)
    with pytest.raises(base.ProtocolError, match=message):
        conn.recv(timeout_s=5)


def test_a_frame_cut_short_by_a_close_is_a_protocol_error_not_a_clean_close(
    raw: tuple[socket.socket, tcp.TcpConnection],
) -> None:
    writer, conn = raw
    writer.sendall(_header(count=100) + b"\0" * 40)
    writer.close()
    with pytest.raises(
        base.ProtocolError, match="truncated frame from raw-peer: expected 400 bytes of values"
    ):
        conn.recv(timeout_s=5)


def test_a_header_cut_short_is_a_protocol_error(
    raw: tuple[socket.socket, tcp.TcpConnection],
) -> None:
    writer, conn = raw
    writer.sendall(_header()[:10])
    writer.close()
    with pytest.raises(base.ProtocolError, match="bytes of header"):
        conn.recv(timeout_s=5)


def test_a_close_between_frames_is_peer_closed(
    raw: tuple[socket.socket, tcp.TcpConnection],
) -> None:
    writer, conn = raw
    writer.close()
    with pytest.raises(base.PeerClosed, match="raw-peer closed the connection"):
        conn.recv(timeout_s=5)


def test_recv_times_out_when_nothing_arrives_and_the_connection_stays_usable(
    raw: tuple[socket.socket, tcp.TcpConnection],
) -> None:
    writer, conn = raw
    start = time.monotonic()
    with pytest.raises(base.TransportTimeout):
        conn.recv(timeout_s=0.2)
    assert 0.15 < time.monotonic() - start < 2
    writer.sendall(_header(count=1) + struct.pack("<f", 2.5))
    assert conn.recv(timeout_s=5).values.tolist() == [2.5]


def test_connections_have_nagle_turned_off(
    pair: tuple[tcp.TcpConnection, tcp.TcpConnection],
) -> None:
    left, _ = pair
    assert left._live().getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_sending_more_values_than_max_elements_fails_before_sending() -> None:
    with pytest.raises(ValueError, match="max_elements=4"):
        tcp.encode(Message(Kind.PUSH, 0, 0, np.zeros(5, np.float32)), max_elements=4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_connect_retries_until_a_late_listener_starts_and_gather_reads_each_peer() -> None:
    port = _free_port()
    transport = tcp.TcpTransport()
    clients: list[base.Connection] = []

    def connect_all() -> None:
        for _ in range(3):
            clients.append(transport.connect("127.0.0.1", port, timeout_s=10))

    thread = threading.Thread(target=connect_all)
    thread.start()
    time.sleep(0.3)  # the workers start first, as they may in a real job
    servers = transport.listen("127.0.0.1", port, count=3, timeout_s=10)
    thread.join()
    try:
        for i, client in enumerate(clients):
            client.send(Message(Kind.HELLO, 0, i))
        got = transport.gather(servers, timeout_s=5)
        assert sorted(m.sender for m in got) == [0, 1, 2]
        assert all(m.kind == Kind.HELLO for m in got)
    finally:
        for conn in clients + servers:
            conn.close()
        transport.close()


def test_listen_times_out_naming_how_many_peers_connected() -> None:
    port = _free_port()
    transport = tcp.TcpTransport()
    thread = threading.Thread(target=lambda: transport.connect("127.0.0.1", port, 5).close())
    thread.start()
    with pytest.raises(base.TransportTimeout, match="only 1 of 2 peers connected"):
        transport.listen("127.0.0.1", port, count=2, timeout_s=0.5)
    thread.join()


def test_a_connect_attempt_outlives_the_first_syn_retransmission(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel resends a lost SYN after 1 s. An attempt that gave up at that moment
    could close a connection the server had just accepted. A full accept queue makes
    the kernel drop the first SYN (a real loss, on loopback): one attempt must wait
    for the resent one."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)  # room for one connection waiting to be accepted
    host, port = listener.getsockname()
    filler = socket.create_connection((host, port))  # ... taken: SYNs are dropped
    attempts: list[float] = []
    create = socket.create_connection

    def counted(*args: object, **kwargs: object) -> socket.socket:
        if args and args[0] == (host, port):   # not another thread's connects
            attempts.append(time.monotonic())
        return create(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "create_connection", counted)
    connected: list[socket.socket] = []
    thread = threading.Thread(target=lambda: connected.append(base.connect_tcp(host, port, 5)))
    start = time.monotonic()
    thread.start()
    try:
        time.sleep(0.5)
        taken, _ = listener.accept()  # the queue has room: the resent SYN gets in
        taken.close()
        thread.join()
        assert connected, "connect_tcp failed"
        assert time.monotonic() - start >= 0.9, "the first SYN was not dropped"
        assert len(attempts) == 1, (
            f"{len(attempts)} attempts: the first gave up before the SYN was resent")
    finally:
        thread.join()
        for sock in connected + [filler, listener]:
            sock.close()


def test_connect_gives_up_after_its_timeout_when_nobody_listens() -> None:
    start = time.monotonic()
    with pytest.raises(base.TransportTimeout, match="is the parameter server running"):
        tcp.TcpTransport().connect("127.0.0.1", _free_port(), timeout_s=0.5)
    assert time.monotonic() - start < 3


@pytest.mark.netns
def test_connect_does_not_take_a_socket_connected_to_itself_for_a_peer() -> None:
    """With nobody listening, a connect whose source port happens to be the target
    port meets itself (TCP simultaneous open). A namespace whose only source port is
    the target forces it: connect must refuse that socket and time out."""
    import os
    import subprocess

    from tailcut.net import netns

    name, port = f"tailcut-tcpself-{os.getpid()}", 40001
    netns.create(name)
    try:
        subprocess.run(["ip", "netns", "exec", name, "sysctl", "-qw",
                        f"net.ipv4.ip_local_port_range={port} {port}"], check=True)
        with netns.entered(name), pytest.raises(base.TransportTimeout,
                                                match="connected to itself"):
            tcp.TcpTransport().connect("127.0.0.1", port, timeout_s=0.5)
    finally:
        netns.remove(name)


def test_listening_on_a_port_in_use_names_the_address() -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(base.TransportError, match=f"cannot listen on 127.0.0.1:{port}"):
            tcp.TcpTransport().listen("127.0.0.1", port, count=1, timeout_s=1)


def test_a_message_with_cuts_goes_as_tagged_parts_and_comes_back_whole(
    pair: tuple[tcp.TcpConnection, tcp.TcpConnection],
) -> None:
    left, right = pair
    tos_seen: list[int] = []
    left.tos_of = lambda level: (8 + level) << 2
    left.cuts[Kind.PARAMS] = (base.Cut(6, 4, 0), base.Cut(0, 6, 2))  # later range first
    real_set_tos = left._set_tos

    def spy(sock: socket.socket, tos: int, deadline: float | None = None) -> None:
        tos_seen.append(tos)
        real_set_tos(sock, tos, deadline)

    left._set_tos = spy  # type: ignore[method-assign]
    values = np.arange(10, dtype=np.float32)
    left.send(Message(Kind.PARAMS, 3, -1, values))
    got = right.recv(timeout_s=5)
    assert (got.kind, got.iteration, got.sender) == (Kind.PARAMS, 3, -1)
    np.testing.assert_array_equal(got.values, values)
    assert got.parts is not None
    assert [(p.offset, p.size, p.level) for p in got.parts] == [(6, 4, 0), (0, 6, 2)]
    assert tos_seen == [(8 + 0) << 2, (8 + 2) << 2]
    assert left._live().getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == (8 + 2) << 2
    assert got.wire_bytes == 2 * (tcp.HEADER.size + tcp.PART.size) + 40


def test_messages_without_cuts_or_of_another_size_go_whole_with_the_control_tos(
    pair: tuple[tcp.TcpConnection, tcp.TcpConnection],
) -> None:
    left, right = pair
    left.cuts[Kind.PARAMS] = (base.Cut(0, 2, 1), base.Cut(2, 2, 0))
    left.control_tos = 32
    left.send(Message(Kind.PARAMS, 1, -1, np.ones(3, dtype=np.float32)))  # 3 != 2 + 2
    left.send(Message(Kind.ACK, 1, -1))
    assert right.recv(timeout_s=5).parts is None
    assert right.recv(timeout_s=5).kind == Kind.ACK
    assert left._live().getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == 32


def test_a_part_that_does_not_fit_its_message_is_a_protocol_error(
    raw: tuple[socket.socket, tcp.TcpConnection],
) -> None:
    a, conn = raw
    a.sendall(_header(kind=3, flags=tcp.FLAG_PART, count=3) + tcp.PART.pack(2, 4, 0)
              + np.zeros(3, dtype="<f4").tobytes())
    with pytest.raises(base.ProtocolError, match=r"part \[2, 5\) of a 4-value message"):
        conn.recv(timeout_s=5)


def test_another_message_between_the_parts_of_one_is_a_protocol_error(
    raw: tuple[socket.socket, tcp.TcpConnection],
) -> None:
    a, conn = raw
    a.sendall(_header(kind=3, flags=tcp.FLAG_PART, count=2) + tcp.PART.pack(0, 4, 0)
              + np.zeros(2, dtype="<f4").tobytes() + _header(kind=2, count=0))
    with pytest.raises(base.ProtocolError, match="before the last part of PARAMS"):
        conn.recv(timeout_s=5)


def test_closing_a_tagged_connection_does_not_wait_for_a_peer_that_stopped_reading() -> None:
    # A PS shard that got STOP no longer reads: the worker's last part stays unsent, and
    # re-tagging the next frame used to wait for it to leave, holding close() for
    # ASYNC_SEND_TIMEOUT_S (30 s) at the end of one cadentflow run in ~8.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a tiny window
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    conn = tcp.TcpConnection(client, "stalled-peer", tcp.DEFAULT_MAX_ELEMENTS)
    conn.cuts[Kind.PUSH] = (base.Cut(0, 50_000, 1), base.Cut(50_000, 10, 2))
    conn.tos_of = lambda level: (8 + level) << 2
    try:
        conn.send(Message(Kind.PUSH, 0, 0, np.ones(50_010, np.float32)))
        time.sleep(0.3)  # the first part is written; the second waits for it to leave
        started = time.monotonic()
        conn.close()
        assert time.monotonic() - started < 5.0
    finally:
        server.close()


def test_a_peer_name_that_resolves_only_later_is_waited_for(monkeypatch) -> None:
    """On Kubernetes ps-0.<job> resolves only once the PS pod has an address: connect
    retries a name not found yet, then connects (here the resolver answers on the
    third try), and a name that never resolves times out saying so."""
    real = socket.create_connection
    tries = {"n": 0}

    def late_name(address, timeout=None):
        tries["n"] += 1
        if tries["n"] < 3:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(("127.0.0.1", address[1]), timeout=timeout)

    with socket.create_server(("127.0.0.1", 0)) as server:
        monkeypatch.setattr(socket, "create_connection", late_name)
        sock = base.connect_tcp("ps-0.job", server.getsockname()[1], timeout_s=5)
        sock.close()
        assert tries["n"] == 3
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: (_ for _ in ()).throw(
        socket.gaierror(socket.EAI_NONAME, "Name or service not known")))
    with pytest.raises(base.TransportTimeout, match="Name or service not known"):
        base.connect_tcp("nowhere.job", 7000, timeout_s=0.5)


def test_a_chosen_congestion_control_is_what_both_ends_use():
    """The spec's tcpCongestionControl reaches every connection (reno: every Linux has
    it), on the accepted side through the listener."""
    import threading
    from tailcut.transports import tcp
    server = tcp.TcpTransport(congestion_control="reno")
    client = tcp.TcpTransport(congestion_control="reno")
    got = []
    t = threading.Thread(target=lambda: got.extend(server.listen("127.0.0.1", 27260, 1, 10)))
    t.start()
    c = client.connect("127.0.0.1", 27260, 10)
    t.join()
    try:
        assert tcp.congestion_control_of(c._live()) == "reno"
        assert tcp.congestion_control_of(got[0]._live()) == "reno"
    finally:
        c.close()
        got[0].close()


def test_an_unknown_congestion_control_is_refused_naming_the_spec_field():
    from tailcut.transports import base, tcp
    with pytest.raises(base.TransportError, match=r"tcpCongestionControl='nosuchcc'.*"
                                                    r"tcp_available_congestion_control"):
        with socket.socket() as s:
            tcp.use_congestion_control(s, "nosuchcc")
