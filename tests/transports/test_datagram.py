"""The udp and bounded-loss transports: delivery, p as a floor, hostile datagrams into a
live receiver, and (as root) the XDP-signalled receiver across a lossy veth."""

import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from tailcut import transports
from tailcut.transports import base, congestion, control, datagram, wire
from tailcut.transports.base import Kind, Message
from tests import waiting

VECTOR = np.random.default_rng(1).standard_normal(50_000).astype(np.float32)  # 139 packets


@contextmanager
def pair(name: str, port: int, server_ctx: Callable[[], Any] | None = None,
         client_ctx: Callable[[], Any] | None = None, host: str = "127.0.0.1",
         **options: Any) -> Iterator[tuple[Any, base.Connection, Any, base.Connection]]:
    """A listening and a connecting transport joined by one connection. The contexts
    (e.g. netns.entered) are entered around listen and connect."""
    server = transports.get(name, **options)
    client = transports.get(name, **options)
    got: dict[str, Any] = {}

    def listen() -> None:
        try:
            with (server_ctx or _nothing)():
                got["conns"] = server.listen(host, port, 1, 10)
        except BaseException as err:  # re-raised in the test thread
            got["error"] = err

    t = threading.Thread(target=listen)
    t.start()
    try:
        with (client_ctx or _nothing)():
            c = client.connect(host, port, 10)
    except base.TransportError as err:
        t.join()
        client.close()
        if "error" in got:  # the listen failed first (port taken?): that is the cause
            raise got["error"] from err
        raise
    finally:
        t.join()
    if "error" in got:
        client.close()
        raise got["error"]
    s = got["conns"][0]
    try:
        yield server, s, client, c
    finally:
        c.close()
        s.close()
        client.close()
        server.close()


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def delivered(msg: Message) -> np.ndarray:
    return np.ones(msg.values.size, bool) if msg.mask is None else msg.mask


def assert_at_least_p(msg: Message, sent: np.ndarray, p: float) -> np.ndarray:
    """At least p of ``sent`` arrived, and what is marked delivered is what was sent;
    returns the mask of what was."""
    ok = delivered(msg)
    assert ok.sum() >= datagram.threshold_elements(p, sent.size)
    assert np.array_equal(msg.values[ok], sent[ok])
    return ok


def test_messages_without_a_vector_travel_on_the_control_channel() -> None:
    with pair("udp", 27201) as (_, s, _client, c):
        c.send(Message(Kind.HELLO, 0, 3))
        msg = s.recv(5)
        assert (msg.kind, msg.iteration, msg.sender, msg.values.size) == (Kind.HELLO, 0, 3, 0)


def test_udp_delivers_a_vector_and_says_what_arrived() -> None:
    with pair("udp", 27202, job="bl-udp") as (_, s, _client, c):
        for i in range(3):
            c.send(Message(Kind.PUSH, i, 2, VECTOR), 10)
            msg = s.recv(10)
            ok = delivered(msg)
            assert (msg.kind, msg.iteration, msg.sender) == (Kind.PUSH, i, 2)
            assert np.array_equal(msg.values[ok], VECTOR[ok])
            assert ok.mean() > 0.5  # loopback, paced by nothing: normally all of it


def test_a_worker_may_name_the_ps_by_a_host_name() -> None:
    """On Kubernetes a worker reaches the PS as ps-0.<job>: its datagrams are still
    told apart by the address they come from (the connection's peer), not the name."""
    server = transports.get("udp", job="bl-name")
    got: dict[str, Any] = {}
    listening = threading.Thread(
        target=lambda: got.update(conns=server.listen("127.0.0.1", 27209, 1, 10)))
    listening.start()
    client = transports.get("udp", job="bl-name")
    try:
        c = client.connect("localhost", 27209, 10)
        listening.join()
        s = got["conns"][0]
        c.send(Message(Kind.PUSH, 0, 1, VECTOR), 10)
        msg = s.recv(10)
        assert delivered(msg).mean() > 0.5
        s.send(Message(Kind.PARAMS, 0, 0, VECTOR), 10)   # and back, to the name's address
        assert c.recv(10).kind == Kind.PARAMS
    finally:
        listening.join()
        client.close()
        server.close()


def test_bounded_loss_delivers_at_least_p_and_stops_sending_there() -> None:
    with pair("bounded-loss", 27203, p=0.8, xdp=False, job="bl-p") as (_, s, client, c):
        for i in range(5):
            c.send(Message(Kind.PUSH, i, 0, VECTOR), 10)
            assert_at_least_p(s.recv(10), VECTOR, 0.8)
        # DONE at p stops the sender before the end of a pass, at least sometimes.
        slots = wire.slots(VECTOR.size, wire.elements_per_packet())
        assert client.stats["packets_sent"] <= 5 * slots


def test_the_receiver_nacks_and_the_sender_retransmits_until_p() -> None:
    """Drop every third packet at the sender's socket: one pass reaches 2/3 < p = 0.9,
    so only retransmissions of NACKed slots can complete the message."""
    with pair("bounded-loss", 27204, p=0.9, xdp=False, job="bl-nack") as (_, s, client, c):
        lose_every_third(client)
        c.send(Message(Kind.PUSH, 0, 0, VECTOR), 10)
        msg = s.recv(10)
        assert delivered(msg).sum() >= datagram.threshold_elements(0.9, VECTOR.size)
        assert client.stats["retransmitted"] > 0 and s.transport.stats["nacks"] >= 1
        # messages.csv's repairs column: the NACK rounds this message took
        assert msg.repairs == s.transport.stats["nacks"]


def lose_every_third(transport: Any) -> None:
    """Drop every third datagram ``transport`` sends, at its socket."""
    real = transport._udp.sendto
    calls = {"n": 0}

    def lossy(data: Any, addr: Any) -> int:
        calls["n"] += 1
        return 0 if calls["n"] % 3 == 0 else real(data, addr)

    transport._udp = _Wrapped(transport._udp, lossy)


def test_with_min_p_a_message_below_p_closes_when_its_pass_ends_instead_of_nacking() -> None:
    """The same loss (every third packet), p = 0.9 and minP = 0.6: the pass's 2/3 is
    handed over once its last packet is in and nothing more comes; nothing is NACKed
    or retransmitted, and the sender gets DONE (its next message goes out)."""
    with pair("bounded-loss", 27215, p=0.9, min_p=0.6, xdp=False, job="bl-early") as \
            (_, s, client, c):
        lose_every_third(client)
        for i in range(2):
            c.send(Message(Kind.PUSH, i, 0, VECTOR), 10)
            msg = s.recv(10)
            got = delivered(msg).sum()
            assert datagram.threshold_elements(0.6, VECTOR.size) <= got \
                < datagram.threshold_elements(0.9, VECTOR.size)
            assert np.array_equal(msg.values[delivered(msg)], VECTOR[delivered(msg)])
        assert s.transport.stats["early_close"] == 2 and s.transport.stats["nacks"] == 0
        assert client.stats["retransmitted"] == 0


@pytest.mark.parametrize("min_p", [0, 0.95, True, "0.5"])
def test_min_p_outside_zero_p_is_refused_naming_min_p(min_p: object) -> None:
    with pytest.raises(ValueError, match=r"min_p=.*must be a fraction in \(0, p=0.9\]"):
        transports.get("bounded-loss", p=0.9, min_p=min_p)


class _Wrapped:
    """A socket whose sendto is replaced (to drop datagrams); the rest passes through."""

    def __init__(self, sock: socket.socket, sendto: Callable[..., int]) -> None:
        self._sock = sock
        self.sendto = sendto

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


@pytest.mark.parametrize("p", [0, -0.5, 1.01, True, "0.9"])
def test_p_outside_zero_one_is_refused_naming_p(p: object) -> None:
    with pytest.raises(ValueError, match=r"p=.*must be a fraction in \(0, 1\]"):
        transports.get("bounded-loss", p=p)


def hostile_datagrams(job: int, message: int, total: int) -> list[bytes]:
    """Every kind of bad packet the issue lists, aimed at a live message."""
    stride = wire.elements_per_packet()
    good = wire.build(job=job, message=message, seq=0, start=0, total=total,
                      values=np.full(stride, 1e30, np.float32))

    def h(**f: int) -> bytes:
        x = wire.header_type().from_buffer_copy(good[:wire.HEADER_BYTES])
        for k, v in f.items():
            setattr(x, k, v)
        return bytes(x) + good[wire.HEADER_BYTES:]

    rng = np.random.default_rng(9)
    return [
        h(magic=0), h(version=7), h(end=0), h(start=10, end=5), h(end=total + 1),
        h(total=total + 360),                      # total disagrees with BEGIN
        h(start=1, end=stride + 1),                # not on a slot boundary
        good[:-3], good[:17], b"", good + b"x",    # truncated / ragged
        h(job=job ^ 0xFFFF), h(message=message ^ 0x5555),  # unknown job / message
        *[rng.bytes(int(rng.integers(0, 1472))) for _ in range(200)],
    ]


def test_hostile_datagrams_do_not_crash_the_receiver_or_corrupt_a_message() -> None:
    """Flood a live receiver with bad packets and with forged duplicates of a slot
    while a real message arrives; the message must come out exactly right."""
    with pair("bounded-loss", 27205, p=1.0, xdp=False, job="bl-hostile") as \
            (server, s, client, c):
        attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        target = server._udp.getsockname()
        message = (c.peer_id << 16) | 1  # the id the client's first message will have
        # An exact copy of the message's first packet: a duplicate flood.
        dup = wire.build(job=server.job_id, message=message, seq=0, start=0,
                         total=VECTOR.size, values=VECTOR[:360])
        try:
            for d in hostile_datagrams(server.job_id, message, VECTOR.size) + [dup] * 500:
                attacker.sendto(d, target)
            c.send(Message(Kind.PUSH, 0, 0, VECTOR), 10)
            for d in hostile_datagrams(server.job_id, message, VECTOR.size) * 3 + [dup] * 500:
                attacker.sendto(d, target)
            msg = s.recv(10)
        finally:
            attacker.close()
        # p = 1: everything arrived, and the forged 1e30s never overwrote a value.
        assert msg.mask is None and np.array_equal(msg.values, VECTOR)
        st = server.stats
        assert st["accepted"] == wire.slots(VECTOR.size, wire.elements_per_packet())
        # and it still works afterwards
        c.send(Message(Kind.PUSH, 1, 0, VECTOR), 10)
        assert np.array_equal(s.recv(10).values, VECTOR)
        # By now the socket has been read past the second flood (it is FIFO).
        assert st["bad_packet"] >= 4 * 200 and st["unknown_job"] >= 4
        assert st["duplicate"] + st["late"] >= 999  # the flood, its slot counted once


def test_forged_packets_from_another_address_are_ignored() -> None:
    """Packets of a live message id from an address that is not the peer's."""
    with pair("udp", 27206, job="bl-forge") as (server, s, client, c):
        forged = wire.build(job=server.job_id, message=(c.peer_id << 16) | 1, seq=0, start=0,
                            total=VECTOR.size, values=np.zeros(360, np.float32))
        attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        attacker.bind(("127.0.0.2", 0))
        try:
            for _ in range(50):
                attacker.sendto(forged, server._udp.getsockname())
            c.send(Message(Kind.PUSH, 0, 0, VECTOR), 10)
            msg = s.recv(10)
        finally:
            attacker.close()
        ok = delivered(msg)
        assert np.array_equal(msg.values[ok], VECTOR[ok])
        assert server.stats["unknown_message"] + server.stats["foreign_source"] >= 50


_OPEN_AND_REPORT = """
import logging, socket, sys
from tailcut import transports
from tailcut.transports import datagram
datagram.DEEP_SOCKET_BYTES = int(sys.argv[1])
logging.basicConfig(level=logging.WARNING)
t = transports.get("udp")
t._open_udp("127.0.0.1", 0)
print(t._udp.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
t.close()
"""


def _open_udp(enough: int, *without_net_admin: str) -> tuple[int, str]:
    """(the receive buffer the kernel granted, the log) of a udp transport opened in
    a child process that counts ``enough`` bytes as enough."""
    done = subprocess.run([*without_net_admin, sys.executable, "-c", _OPEN_AND_REPORT,
                           str(enough)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return int(done.stdout), done.stderr


def _has_net_admin() -> bool:
    with open("/proc/self/status") as f:
        caps = next(line for line in f if line.startswith("CapEff:"))
    return bool(int(caps.split()[1], 16) >> 12 & 1)   # CAP_NET_ADMIN is capability 12


@pytest.mark.skipif(not _has_net_admin() or shutil.which("setpriv") is None,
                    reason="drops CAP_NET_ADMIN with setpriv (util-linux)")
def test_a_receive_buffer_capped_by_rmem_max_is_named_in_a_warning() -> None:
    # Root forces the buffer past net.core.rmem_max (the kernel reports twice the size)
    granted, log = _open_udp(datagram.DEEP_SOCKET_BYTES)
    assert granted == 2 * datagram.SOCKET_BUFFER_BYTES and "receive buffer" not in log
    # ... a role without CAP_NET_ADMIN (a udp pod on Kubernetes) gets rmem_max at most.
    rmem_max = int(open("/proc/sys/net/core/rmem_max").read())
    granted, log = _open_udp(2 * rmem_max + 1, "setpriv", "--bounding-set=-net_admin",
                             "--inh-caps=-net_admin")
    assert granted == 2 * min(rmem_max, datagram.SOCKET_BUFFER_BYTES)
    assert f"the kernel granted a {granted}-byte receive buffer" in log
    assert "net.core.rmem_max" in log and "CAP_NET_ADMIN" in log


def test_a_vector_beyond_the_slot_limit_is_refused_before_sending() -> None:
    with pair("udp", 27207, job="bl-big") as (_, _s, _client, c):
        too_big = np.zeros(datagram.MAX_SLOTS * 360 + 1, np.float32)
        with pytest.raises(ValueError, match="at most"):
            c.send(Message(Kind.PUSH, 0, 0, too_big))


# ---- as root: the XDP-signalled receiver across a real, lossy veth ---------------------


@pytest.fixture
def lossy_link() -> Iterator[Any]:
    from tailcut.datapath import dropper
    from tests.datapath.udp_link import IFNAME, build_link, remove_link
    link = build_link("t")
    drops = [dropper.attach(link.sender, IFNAME, 0.1), dropper.attach(link.receiver, IFNAME, 0.1)]
    try:
        yield link
    finally:
        for d in drops:
            d.detach()
        remove_link(link)


@pytest.mark.netns
@pytest.mark.bpf
def test_bounded_loss_over_a_lossy_veth_completes_on_the_xdp_event(lossy_link: Any) -> None:
    """10% loss each way, p = 0.8: every message arrives with at least p, completed by
    the XDP counter's event; the control channel survives the loss too."""
    from tailcut.net import netns
    from tests.datapath.udp_link import RECEIVER_IP
    with pair("bounded-loss", 27210, lambda: netns.entered(lossy_link.receiver),
              lambda: netns.entered(lossy_link.sender), host=RECEIVER_IP, p=0.8,
              job="bl-xdp", rate_bit=500e6) as (server, s, client, c):
        assert server.counter.mode == "generic" and client.counter.mode == "generic"
        for i in range(10):
            c.send(Message(Kind.PUSH, i, 1, VECTOR), 20)
            assert_at_least_p(s.recv(20), VECTOR, 0.8)
            s.send(Message(Kind.PARAMS, i, -1, VECTOR), 20)  # and back, through XDP too
            back = c.recv(20)
            assert delivered(back).sum() >= datagram.threshold_elements(0.8, VECTOR.size)
        reasons = [r["reason"] for r in server.completions]
        assert reasons.count("xdp") + reasons.count("full") == 10, reasons
        assert server.counter.stats()["counted"] >= 10 * 112
        # Every entry is freed after completion, and again if late packets re-create it.
        deadline = time.monotonic() + 1
        while server.counter.messages() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.counter.messages() == []
        # Late packets of the last message (no completion follows to free their entry):
        # they re-create it in the counter, and the receiver frees it again.
        last = (c.peer_id << 16) | 10
        late_before = server.stats["late"]
        for slot in range(20):  # 10% loss on the way: some get through
            start = slot * 360
            client._udp.sendto(wire.build(job=server.job_id, message=last, seq=slot,
                                          start=start, total=VECTOR.size,
                                          values=VECTOR[start:start + 360]),
                               server._udp.getsockname())
        assert waiting.until(lambda: server.stats["late"] > late_before, 5)
        deadline = time.monotonic() + 1
        while server.counter.messages() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.counter.messages() == []
    from tests.datapath.udp_link import IFNAME
    with netns.ipr(lossy_link.receiver) as ipr:
        link = ipr.get_links(ipr.link_lookup(ifname=IFNAME)[0])[0]
        assert not link.get_nested("IFLA_XDP", "IFLA_XDP_ATTACHED")  # close() detached it


@pytest.mark.netns
@pytest.mark.bpf
def test_xdp_entries_are_freed_while_messages_keep_coming_back_to_back(clean_link: Any) -> None:
    """A ping-pong with no pause as long as the freeing delay: finished messages' XDP
    entries are still freed meanwhile (each completion used to push the freeing back,
    so back-to-back traffic filled the counter's table and no message fired any more)."""
    from tailcut.net import netns
    from tests.datapath.udp_link import RECEIVER_IP
    with pair("bounded-loss", 27250, lambda: netns.entered(clean_link.receiver),
              lambda: netns.entered(clean_link.sender), host=RECEIVER_IP, p=0.9,
              job="bl-free", gso=True) as (server, s, client, c):
        most, messages = 0, 60
        for i in range(messages):
            c.send(Message(Kind.PUSH, i, 1, VECTOR), 20)
            s.recv(20)
            s.send(Message(Kind.PARAMS, i, -1, VECTOR), 20)
            c.recv(20)
            most = max(most, len(server.counter.messages()))
        assert most < messages / 2, most  # without the fix: 33 (none freed)
        assert server.counter.stats().get("table_full", 0) == 0


@pytest.fixture
def clean_link() -> Iterator[Any]:
    from tests.datapath.udp_link import build_link, remove_link
    link = build_link("g")
    try:
        yield link
    finally:
        remove_link(link)


@pytest.mark.netns
@pytest.mark.bpf
@pytest.mark.parametrize("cut", [True, False])
def test_with_gso_the_xdp_counter_and_the_receiver_see_every_datagram_cut_or_whole(
        clean_link: Any, cut: bool) -> None:
    """UDP GSO sends up to 64 KiB at once. Where the sender's link cuts it into wire
    packets (gso_max_segs 1, what tailcut.net.build sets on a path that drops), the
    counter and the socket see datagrams; where nothing cuts it, they see the whole
    GSO message: the counter walks it datagram by datagram and the socket (UDP_GRO)
    reads it in one go. Either way every datagram is counted once and delivered."""
    from tailcut.net import netns
    from tailcut.transports import wire
    from tests.datapath.udp_link import IFNAME, RECEIVER_IP
    if cut:
        subprocess.run(["ip", "-n", clean_link.sender, "link", "set", "dev", IFNAME,
                        "gso_max_segs", "1"], check=True)
    with pair("bounded-loss", 27240 + cut, lambda: netns.entered(clean_link.receiver),
              lambda: netns.entered(clean_link.sender), host=RECEIVER_IP, p=1.0,
              job="bl-gso", gso=True) as (server, s, client, c):
        for i in range(5):
            c.send(Message(Kind.PUSH, i, 1, VECTOR), 20)
            msg = s.recv(20)
            assert delivered(msg).all() and np.array_equal(msg.values, VECTOR)
        packets = 5 * wire.slots(VECTOR.size, server.stride)
        assert server.counter.stats()["counted"] == packets
        whole = server.stats.get("gso_messages_read", 0)
        assert (whole == 0) if cut else (whole >= 5), whole  # 44-datagram bursts
        assert server.stats.get("gso_misfits", 0) == 0


@pytest.mark.netns
@pytest.mark.bpf
@pytest.mark.parametrize("gso", [True, False])
def test_a_path_gone_for_a_moment_loses_datagrams_and_the_messages_still_arrive(
        clean_link: Any, gso: bool) -> None:
    """The sender's address goes for 0.4 s mid-stream, as a pod's link does while the
    node agent that wired it restarts (the old one removes it, the new one wires it
    again). Its datagram sends fail then (ENETUNREACH): that is loss, repaired like
    any other, not the end of the job (it was, on the cluster). The message sent
    during the outage is sent after its predecessor's DONE is in (a connection's
    messages go one after the other), so every one of its datagrams meets the outage;
    a timer cutting the path at some moment mid-stream could instead fall while the
    sender waited for a DONE, and then nothing was refused."""
    from tailcut.net import netns
    from tests.datapath.udp_link import IFNAME, RECEIVER_IP, SENDER_IP
    with pair("bounded-loss", 27260 + gso, lambda: netns.entered(clean_link.receiver),
              lambda: netns.entered(clean_link.sender), host=RECEIVER_IP, p=0.9,
              job="bl-outage", gso=gso, rate_bit=200e6) as (server, s, client, c):
        ip = ["ip", "-n", clean_link.sender, "addr"]

        def exchange(i: int) -> None:
            c.send(Message(Kind.PUSH, i, 1, VECTOR), 20)
            msg = s.recv(20)
            assert delivered(msg).sum() >= datagram.threshold_elements(0.9, VECTOR.size)

        for i in range(3):
            exchange(i)
        assert waiting.until(lambda: not c.tx, 5)   # the last one's DONE is in
        subprocess.run([*ip, "del", f"{SENDER_IP}/24", "dev", IFNAME], check=True)
        back = threading.Timer(0.4, lambda: subprocess.run(
            [*ip, "add", f"{SENDER_IP}/24", "dev", IFNAME], check=True))
        back.start()
        try:
            for i in range(3, 6):   # the first during the outage, then after it
                exchange(i)
        finally:
            back.join()
        assert client.stats["unsent"] > 0, client.stats   # the outage was met mid-send


# ---- CadentFlow: a message tagged per tensor ------------------------------------------

# Three tensors in model order; sent most urgent first: the last, then the first two.
CUTS = (base.Cut(40_000, 10_000, 0), base.Cut(0, 32, 1), base.Cut(32, 39_968, 2))


def tag(conn: Any) -> None:
    from tailcut.datapath import classifier  # only its DSCP mapping: no BPF loaded
    conn.cuts[Kind.PUSH] = CUTS
    conn.tos_of = classifier.tos_of


def test_a_tagged_message_arrives_exactly_with_one_timed_part_per_cut_in_send_order() -> None:
    with pair("udp", 27220, job="dg-parts", rate_bit=300e6) as (server, s, _client, c):
        tag(c)
        for i in range(3):
            c.send(Message(Kind.PUSH, i, 0, VECTOR), 10)
            msg = s.recv(10)
            ok = delivered(msg)
            assert msg.values.size == VECTOR.size
            assert np.array_equal(msg.values[ok], VECTOR[ok])
            assert msg.parts is not None
            assert [(p.offset, p.size, p.level) for p in msg.parts] == \
                [(c.offset, c.size, c.level) for c in CUTS]
            done = [p.received_at_ns for p in msg.parts]
            assert done == sorted(done) and done[-1] <= msg.received_at_ns
            assert all(p.sent_at_ns == msg.sent_at_ns for p in msg.parts)
        # Packets are whole slots of one cut each: the padding is not counted as data.
        record = server.completions[-1]
        assert record["total"] == VECTOR.size
        assert [cut[:3] for cut in record["cuts"]] == [(c.offset, c.size, c.level) for c in CUTS]


def test_bounded_loss_reaches_p_of_the_whole_message_by_cutting_the_least_urgent_short() -> None:
    """DONE comes at p of the whole message and the cuts go most urgent first, so the
    urgent tensor arrives whole and what is left out falls on the last one."""
    with pair("bounded-loss", 27221, p=0.5, xdp=False, job="dg-short",
              rate_bit=200e6) as (server, s, client, c):
        tag(c)
        last = []
        for i in range(5):
            c.send(Message(Kind.PUSH, i, 0, VECTOR), 10)
            msg = s.recv(10)
            ok = delivered(msg)
            assert ok.sum() >= datagram.threshold_elements(0.5, VECTOR.size)
            assert np.array_equal(msg.values[ok], VECTOR[ok])
            assert ok[40_000:].all() and ok[:32].all()  # levels 0 and 1: whole
            last.append(ok[32:40_000].mean())
        assert min(last) < 1.0, last  # at 200 Mbit/s DONE stops the pass in the last cut
        assert client.stats["packets_sent"] < 5 * len(server.completions[-1]["cuts"]) * 139


def test_retransmissions_of_a_tagged_message_keep_the_cut_order() -> None:
    with pair("bounded-loss", 27222, p=0.95, xdp=False, job="dg-retx") as \
            (_server, s, client, c):
        tag(c)
        real = client._udp.sendto
        sent: list[tuple[int, int]] = []  # (flags, start) of every datagram sent
        calls = {"n": 0}

        def lossy(data: Any, addr: Any) -> int:
            calls["n"] += 1
            p = wire.parse(data)
            sent.append((p.flags, p.start))
            return 0 if calls["n"] % 3 == 0 else real(data, addr)

        client._udp = _Wrapped(client._udp, lossy)
        c.send(Message(Kind.PUSH, 0, 0, VECTOR), 10)
        msg = s.recv(10)
        assert delivered(msg).sum() >= datagram.threshold_elements(0.95, VECTOR.size)
        def cut_of(start: int) -> int:  # wire slots 0..27 are cut 0, 28 cut 1, then cut 2
            return 0 if start < 28 * 360 else 1 if start < 29 * 360 else 2

        passes: list[list[int]] = [[]]  # the cut of every datagram, pass by pass
        for flags, start in sent:
            passes[-1].append(cut_of(start))
            if flags & wire.F_LAST:
                passes.append([])
        assert len(passes) > 2  # the first pass and at least one of retransmissions
        assert all(p == sorted(p) for p in passes), passes


def test_a_begin_with_a_bad_cut_table_is_a_protocol_error_naming_the_table() -> None:
    with pair("udp", 27223, job="dg-badtable") as (_server, s, _client, c):
        c.channel.send(control.Frame(control.FrameType.BEGIN, int(Kind.PUSH),
                                     (c.peer_id << 16) | 7, 0, 0, 1000, 0, b"\0" * 10))
        with pytest.raises(base.ProtocolError, match="cut table of 10 bytes"):
            s.recv(5)


def test_hostile_datagrams_cannot_corrupt_a_tagged_message() -> None:
    with pair("bounded-loss", 27224, p=1.0, xdp=False, job="dg-hostile") as \
            (server, s, _client, c):
        tag(c)
        wire_total = 28 * 360 + 360 + 39_968  # the layout of CUTS
        message = (c.peer_id << 16) | 1
        attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        target = server._udp.getsockname()
        # The slot of the 32-element cut, its padding forged full of 1e30s (from the
        # peer's own address, so it is taken): the padding must land nowhere.
        forged = np.full(360, 1e30, np.float32)
        forged[:32] = VECTOR[:32]
        pad = wire.build(job=server.job_id, message=message, seq=0, start=28 * 360,
                         total=wire_total, values=forged)
        try:
            for d in hostile_datagrams(server.job_id, message, wire_total) + [pad] * 100:
                attacker.sendto(d, target)
            c.send(Message(Kind.PUSH, 0, 0, VECTOR), 10)
            msg = s.recv(10)
        finally:
            attacker.close()
        assert msg.mask is None and np.array_equal(msg.values, VECTOR)


@pytest.fixture
def classified_link() -> Iterator[Any]:
    """Two namespaces on a 100 Mbit/s HTB link with 4 priority classes and the DSCP
    classifier on the sender's egress."""
    from tailcut.datapath import classifier
    from tailcut.net import netns, shaping, tc
    from tailcut.spec.model import Link
    from tests.datapath.udp_link import IFNAME, build_link, remove_link
    link = build_link("dg")
    try:
        with netns.ipr(link.sender) as ipr:
            tc.apply(shaping.plan(Link(bandwidth="100Mbit"), False, "dg"), ipr,
                          link.sender, IFNAME)
            tc.apply_priorities(shaping.plan_priorities(100_000_000, 4), ipr, IFNAME)
        with classifier.attach(link.sender, IFNAME) as counter:
            yield link, counter
    finally:
        remove_link(link)


@pytest.mark.netns
@pytest.mark.bpf
def test_each_cut_of_a_tagged_message_lands_in_its_priority_class(classified_link: Any) -> None:
    """The classifier's per-level packet counts on the sender's egress equal the
    packets of the cuts at each level, exactly; the receiver completes the urgent cuts
    before the least urgent one."""
    from tailcut.datapath import classifier
    from tailcut.net import netns
    from tests.datapath.udp_link import RECEIVER_IP
    link, counter = classified_link
    layout_slots = {0: 28, 1: 1, 2: 112}  # CUTS on the wire: see test_cutlayout
    messages = 4
    with pair("udp", 27230, lambda: netns.entered(link.receiver),
              lambda: netns.entered(link.sender), host=RECEIVER_IP, job="dg-cls") as \
            (server, s, client, c):
        assert client._pace_bit == 100e6  # paced at the HTB link's rate
        tag(c)
        for i in range(messages):
            c.send(Message(Kind.PUSH, i, 0, VECTOR), 20)
            msg = s.recv(20)
            assert msg.parts is not None
            done = [p.received_at_ns for p in msg.parts]
            # Levels 0 and 1 before level 2. (Level 1's single packet may pass level 0's
            # last ones: HTB serves a class under its rate before one borrowing above
            # it, whatever their priorities; a loaded CI host saw it once.)
            assert max(done[:2]) <= done[2], done
            ok = delivered(msg)
            assert np.array_equal(msg.values[ok], VECTOR[ok])
        # A message that arrived whole is delivered before its ENDs are read: the
        # sender thread sends them right after, so wait until it has.
        waiting.until(lambda: not c.tx, within_s=5)
        counts = counter.counts()
        for level, slots in layout_slots.items():
            # Its cuts' packets, and the one END frame per class each pass ends with.
            assert counts[level][0] == messages * (slots + 1), (level, counts)
        assert counts[3][0] == 0
        # Control frames carry control_tos: move them to level 3 and send HELLOs.
        c.control_tos = classifier.tos_of(3)
        for i in range(5):
            c.send(Message(Kind.HELLO, i, 0), 20)
            assert s.recv(20).kind == Kind.HELLO
        assert counter.counts()[3][0] >= 5
        assert counter.counts()[0][0] == messages * (layout_slots[0] + 1)


# ---- congestion: grants and asynchronous sending ----------------------------------------


def test_a_grant_paces_only_the_message_it_names_and_never_below_the_floor() -> None:
    from tailcut.transports import congestion
    with pair("bounded-loss", 27211, p=0.9, xdp=False, job="bl-grant") as (_, _s, client, c):
        tx = c.tx[0xABC] = datagram._Tx()
        try:
            client._on_frame(c, control.Frame(control.FrameType.GRANT, message=0xABC, count=0))
            assert tx.grant_bit == congestion.MIN_RATE_BIT   # a hostile 0 is bounded
            client._on_frame(c, control.Frame(control.FrameType.GRANT, message=0xABC,
                                              count=250_000))
            assert tx.grant_bit == 250e6 and tx.lowest_grant_bit == congestion.MIN_RATE_BIT
            # a grant of a message not being sent (finished, or never begun) is moot
            client._on_frame(c, control.Frame(control.FrameType.GRANT, message=0xDEF,
                                              count=1))
            assert 0xDEF not in c.tx
        finally:
            del c.tx[0xABC]


def test_a_failure_while_sending_is_raised_by_the_next_send_and_by_recv() -> None:
    """Every datagram lost: the message cannot reach p before its deadline. send has
    returned by then (the packets go out from the connection's sender thread), so the
    timeout is what the role sees next, from recv and from send."""
    with pair("bounded-loss", 27212, p=0.9, xdp=False, job="bl-fail") as (_, _s, client, c):
        client._udp = _Wrapped(client._udp, lambda data, addr: len(data))  # all lost
        started = time.monotonic()
        c.send(Message(Kind.PUSH, 0, 0, VECTOR), 0.5)
        assert time.monotonic() - started < 0.5   # handed over, not sent yet
        with pytest.raises(base.TransportTimeout, match="ran out of time|did not confirm"):
            c.recv(10)
        with pytest.raises(base.TransportTimeout, match="ran out of time|did not confirm"):
            c.send(Message(Kind.PUSH, 1, 0, VECTOR), 1)


def test_messages_sent_back_to_back_arrive_whole_and_in_order() -> None:
    with pair("bounded-loss", 27213, p=1.0, xdp=False, job="bl-order") as (_, s, _client, c):
        vectors = [VECTOR * (i + 1) for i in range(4)]
        for i, v in enumerate(vectors):
            c.send(Message(Kind.PUSH, i, 0, v), 10)
        vectors[0][:] = 0   # the caller may reuse its array once send returns
        got = [s.recv(10) for _ in vectors]
        assert [m.iteration for m in got] == [0, 1, 2, 3]
        assert np.array_equal(got[0].values, VECTOR)
        assert all(np.array_equal(m.values, VECTOR * (i + 1)) for i, m in enumerate(got))


def test_p_stays_a_floor_whatever_grants_arrive_meanwhile() -> None:
    """Every third datagram lost at the sender, and a stream of GRANTs from the peer for
    the live message and for ids never sent (any rate, 0 included): each message still
    arrives with at least p, exactly as sent where it arrived."""
    rng = np.random.default_rng(11)
    with pair("bounded-loss", 27214, p=0.9, xdp=False, job="bl-grants") as \
            (_, s, client, c):
        lose_every_third(client)
        for i in range(3):
            live = (c.peer_id << 16) | (i + 1)   # the id this message gets
            c.send(Message(Kind.PUSH, i, 0, VECTOR), 20)
            for _ in range(50):
                mid = live if rng.random() < 0.3 else int(rng.integers(0, 1 << 32))
                kbit = int(rng.integers(0, 1 << 32)) if mid != live else \
                    int(rng.integers(100_000, 1 << 32))
                s.channel.send(control.Frame(control.FrameType.GRANT, message=mid,
                                             count=kbit))
            msg = s.recv(20)
            ok = delivered(msg)
            assert ok.sum() >= datagram.threshold_elements(0.9, VECTOR.size)
            assert np.array_equal(msg.values[ok], VECTOR[ok])
        assert client.stats["retransmitted"] > 0


def test_replies_to_two_peers_at_once_go_one_after_the_other_over_a_shaped_link() -> None:
    """A PS's replies to two workers over its 100 Mbit/s link (``rate_bit``): the first
    begun goes whole at the link's rate, then the second (srpt.py), rather than both at
    half the rate; every datagram is recorded as it is sent."""
    server = transports.get("bounded-loss", p=1.0, xdp=False, job="bl-srpt", rate_bit=100e6)
    clients = [transports.get("bounded-loss", p=1.0, xdp=False, job="bl-srpt")
               for _ in range(2)]
    got: dict[str, Any] = {}
    t = threading.Thread(target=lambda: got.setdefault(
        "conns", server.listen("127.0.0.1", 27215, 2, 10)))
    t.start()
    try:
        peers = [c.connect("127.0.0.1", 27215, 10) for c in clients]
        t.join()
        conns = sorted(got["conns"], key=lambda conn: conn.peer_id)
        sent_to: list[tuple[str, int]] = []
        real = server._udp.sendto

        def recorded(data: Any, addr: tuple[str, int]) -> int:
            sent_to.append(addr)
            return int(real(data, addr))

        server._udp = _Wrapped(server._udp, recorded)
        for conn in conns:
            conn.send(Message(Kind.PARAMS, 0, -1, VECTOR), 10)
        got_back = [peer.recv(10) for peer in peers]
        assert all(np.array_equal(m.values, VECTOR) for m in got_back)
        first = sent_to[0]
        switch = next(i for i, addr in enumerate(sent_to) if addr != first)
        assert switch >= 139 and all(addr != first for addr in sent_to[switch:])
    finally:
        t.join()
        for c in clients:
            c.close()
        server.close()


def test_a_worker_connected_to_two_ps_shards_gets_and_sends_each_its_own_messages() -> None:
    """One transport connects twice (a worker of two PS shards): one UDP socket, and
    message ids that do not collide although each shard gives the worker the same
    connection id."""
    shards = [transports.get("bounded-loss", p=1.0, xdp=False, job="bl-shards")
              for _ in range(2)]
    worker = transports.get("bounded-loss", p=1.0, xdp=False, job="bl-shards")
    got: list[list[base.Connection]] = [[], []]
    threads = [threading.Thread(target=lambda i=i: got[i].extend(
        shards[i].listen("127.0.0.1", 27216 + i, 1, 10))) for i in range(2)]
    for t in threads:
        t.start()
    try:
        conns = [worker.connect("127.0.0.1", 27216 + i, 10) for i in range(2)]
        for t in threads:
            t.join()
        ps_side = [g[0] for g in got]
        assert ps_side[0].peer_id == ps_side[1].peer_id == 1   # what each shard gave it
        assert len({c.peer_id for c in conns}) == 2
        for i, conn in enumerate(ps_side):
            conn.send(Message(Kind.PARAMS, 0, -1, VECTOR * (i + 1)), 10)
        for i, conn in enumerate(conns):
            conn.send(Message(Kind.PUSH, 0, 0, VECTOR * (i + 3)), 10)
        for i, conn in enumerate(conns):
            assert np.array_equal(conn.recv(10).values, VECTOR * (i + 1))
        for i, conn in enumerate(ps_side):
            assert np.array_equal(conn.recv(10).values, VECTOR * (i + 3))
    finally:
        for t in threads:
            t.join()
        worker.close()
        for s in shards:
            s.close()


def _listen_in_background(server: Any, port: int, timeout_s: float
                          ) -> tuple[threading.Thread, dict[str, Any]]:
    """``server.listen`` for one peer on loopback ``port`` in a thread; what it returned
    goes in the dict as "conns", what it raised as "error"."""
    got: dict[str, Any] = {}

    def listen() -> None:
        try:
            got["conns"] = server.listen("127.0.0.1", port, 1, timeout_s)
        except BaseException as err:  # re-raised or checked in the test thread
            got["error"] = err

    t = threading.Thread(target=listen)
    t.start()
    return t, got


@pytest.mark.parametrize("hello", [
    control.Frame(control.FrameType.SETUP, message=0x10000, count=4000),   # id too large
    control.Frame(control.FrameType.SETUP, message=1, count=0),            # no UDP port
    control.Frame(control.FrameType.BEGIN, message=1, count=4000),         # not a SETUP
])
def test_a_bad_setup_is_refused_naming_what_is_wrong(hello: control.Frame) -> None:
    server = transports.get("bounded-loss", p=0.9, xdp=False, job="bl-setup")
    t, got = _listen_in_background(server, 27218, 10)
    try:
        conn: list[socket.socket] = []
        assert waiting.until(lambda: _connect("127.0.0.1", 27218, conn), 10)
        with conn[0] as sock:
            sock.sendall(hello.encode())
            t.join(10)
    finally:
        t.join()
        server.close()
    assert isinstance(got.get("error"), base.ProtocolError)
    assert "expected SETUP with a UDP port and a connection id" in str(got["error"])


def test_listen_waits_for_the_next_connection_of_a_peer_that_gave_up_before_setup() -> None:
    """A connect attempt that timed out as its handshake completed (a lost SYN) closes
    a connection the listener has accepted, and the peer connects again: the listener
    must take the second, not fail on the first."""
    server = transports.get("bounded-loss", p=1.0, xdp=False, job="bl-gave-up")
    client = transports.get("bounded-loss", p=1.0, xdp=False, job="bl-gave-up")
    t, got = _listen_in_background(server, 27219, 10)
    try:
        gave_up: list[socket.socket] = []
        assert waiting.until(lambda: _connect("127.0.0.1", 27219, gave_up), 10)
        gave_up[0].close()
        conn = client.connect("127.0.0.1", 27219, 10)
        t.join(10)
        assert "error" not in got, got.get("error")
        conn.send(Message(Kind.PUSH, 0, 0, VECTOR), 10)
        assert np.array_equal(got["conns"][0].recv(10).values, VECTOR)
    finally:
        t.join()
        client.close()
        server.close()


def test_listen_names_a_peer_that_connected_and_never_sent_setup() -> None:
    """A silent peer is not a closed one: the listener times out saying so."""
    server = transports.get("bounded-loss", p=0.9, xdp=False, job="bl-silent")
    t, got = _listen_in_background(server, 27225, 1.0)
    silent: list[socket.socket] = []
    try:
        assert waiting.until(lambda: _connect("127.0.0.1", 27225, silent), 10)
        t.join(10)
    finally:
        t.join()
        for sock in silent:
            sock.close()
        server.close()
    assert isinstance(got.get("error"), base.TransportTimeout)
    assert "sent no SETUP in time" in str(got["error"])


def _connect(host: str, port: int, into: list[socket.socket]) -> bool:
    try:
        into.append(socket.create_connection((host, port), timeout=1))
        return True
    except OSError:
        return False


def test_a_message_starting_at_the_share_its_receiver_would_grant_gets_no_grant(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first message starts at its sender's link rate and is granted the receiver's
    share; the next ones start at that grant (said in BEGIN), and no GRANT follows.
    (Other traffic on loopback is not sampled: the share stays the whole link.)"""
    monkeypatch.setattr(congestion.LinkMonitor, "sample", lambda self, now: None)
    with pair("bounded-loss", 27216, p=1.0, xdp=False, job="bl-nogrant", link_bit=300e6) as \
            (server, s, _client, c):
        for i in range(3):
            c.send(Message(Kind.PUSH, i, 0, VECTOR), 10)
            assert np.array_equal(s.recv(10).values, VECTOR)
            # (its sender takes the grant as the next one's start once DONE is read)
            waiting.until(lambda: not c.tx, within_s=5)
            assert server.stats["grants"] == 1
        assert c.start_grant_bit == 300e6
