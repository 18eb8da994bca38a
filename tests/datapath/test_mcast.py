"""The parameters' multicast at a ToR (ebpf/mcast.bpf.c): every hostile packet dropped
with its one reason and no copy made; each PARAMS to the rack's address copied exactly
once to every worker's port, addressed to that worker, over real veths and a bridge;
a copy lost on a worker's port (the project's dropper) repaired by the PS. Whole runs
over a real fabric are in tests/runtime/test_in_network_multicast.py."""

import contextlib
import os
import socket
import struct
from dataclasses import dataclass

import numpy as np
import pytest

from tailcut.datapath import bpfsys, dropper, mcast
from tailcut.datapath import mcastformat as fmt
from tailcut.net import netns
from tailcut.transports import mcast as wire_mcast
from tailcut.transports.hot import SO_NO_CHECK
from tests.datapath.frames import udp_frame

pytestmark = [pytest.mark.bpf]

JOB = 0x1234ABCD
TC_ACT_SHOT = 2
TC_ACT_UNSPEC = 0xFFFFFFFF   # -1 as the test run's u32: on to the port's next filter
ELEMENTS = 400               # two slots: 360 and 40
ADDRESS = "10.99.0.252"
RACK = 1


@contextlib.contextmanager
def _rack():
    with mcast.Replicator(job=JOB, rack=RACK, elements=ELEMENTS, address=ADDRESS) as r:
        _port(r, "ps")
        yield r


@pytest.fixture
def rack():
    with _rack() as r:
        yield r


@pytest.fixture(scope="module")
def hostile_rack():
    """One replicator for the hostile packets: each is checked against the state it found
    and must leave it as it was (asserted), so they share one load instead of a BCC
    compile each (about 0.8 s of CPU, several seconds on a busy host)."""
    with _rack() as r:
        yield r


def _port(r, kind: str) -> None:
    """Describe port 0 (a test run's skb has tc_classid 0)."""
    ports = r.program.table("mcast_ports")
    leaf = ports.Leaf()
    leaf.kind = mcast._KINDS[kind] if kind else 0
    ports[ports.Key(0)] = leaf


def _params(*, iteration=3, slot=0, job=JOB, count=None, op=fmt.PARAMS, worker=0,
            values=None):
    n = fmt.slot_length(ELEMENTS, slot) if slot < fmt.slots(ELEMENTS) else 8
    payload = (np.arange(n, dtype="<f4") if values is None else values).tobytes()
    data = wire_mcast.packet(op, job=job, iteration=iteration, slot=slot, payload=payload,
                             count=n, worker=worker)
    if count is not None:
        data = data[:20] + struct.pack(">I", count) + data[24:]
    return data


def _run(r, payload: bytes, **frame):
    return bpfsys.test_run_output(r.program.fds[mcast.FUNCTION],
                                  udp_frame(payload, fmt.PORT, dst=ADDRESS, **frame))


def _state(r):
    """What a hostile packet must not change: the port table and the copies sent."""
    ports, copies = r.program.table("mcast_ports"), r.program.table("mcast_copies")
    keys = range(fmt.const("PORTS"))
    return ([bytes(ports[ports.Key(k)]) for k in keys],
            [sum(copies[copies.Key(k)]) for k in keys])


def _delta(before, after):
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


HOSTILE = {
    "short": lambda: _params()[:20],
    "bad_magic": lambda: b"XXXX" + _params()[4:],
    "bad_version": lambda: _params()[:4] + b"\x09" + _params()[5:],
    "bad_op": lambda: _params(op=fmt.REPAIR),             # the PS's, never the ToR's
    "worker_set": lambda: _params(worker=2),               # only the ToR's copies say it
    "rack_set": lambda: _params()[:24] + b"\0\0\0\1" + _params()[28:],
    "unknown_job": lambda: _params(job=JOB + 1),
    "bad_slot": lambda: _params(slot=2),
    "bad_count": lambda: _params(count=359),
    "bad_length": lambda: _params() + b"\0\0\0\0",
}
REASON = {"worker_set": "bad_op", "rack_set": "bad_op"}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_packet_is_dropped_with_its_one_reason_and_copies_nothing(hostile_rack, case):
    rack = hostile_rack
    before, state = rack.stats(), _state(rack)
    verdict, _ = _run(rack, HOSTILE[case]())
    assert verdict == TC_ACT_SHOT
    assert _delta(before, rack.stats()) == {REASON.get(case, case): 1}
    assert _state(rack) == state


@pytest.mark.parametrize("kind, reason", [("worker", "wrong_port"), ("", "no_port")])
def test_params_not_from_the_way_from_the_ps_are_refused(rack, kind, reason):
    _port(rack, kind)
    before, state = rack.stats(), _state(rack)
    assert _run(rack, _params())[0] == TC_ACT_SHOT
    assert _delta(before, rack.stats()) == {reason: 1}
    assert _state(rack) == state


def test_ip_options_fragments_and_lying_lengths_are_refused(rack):
    for frame, reason in (({"ihl": 6}, "bad_ip"), ({"frag_off": 0x2000}, "bad_ip"),
                          ({"udp_len": 100}, "bad_length")):
        before = rack.stats()
        assert _run(rack, _params(), **frame)[0] == TC_ACT_SHOT
        assert _delta(before, rack.stats()) == {reason: 1}


def test_random_bytes_never_crash_or_copy(rack):
    rng = np.random.default_rng(0)
    state = _state(rack)
    for _ in range(300):
        size = int(rng.integers(0, 1500))
        payload = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        if rng.random() < 0.5 and size >= 4:   # past the magic check
            payload = struct.pack(">I", fmt.const("MAGIC")) + payload[4:]
        assert _run(rack, payload)[0] == TC_ACT_SHOT
    assert _state(rack) == state


def test_traffic_not_for_the_address_goes_on_untouched_and_uncounted(rack):
    before = rack.stats()
    for frame in (udp_frame(_params(), 7000, dst=ADDRESS),
                  udp_frame(_params(), fmt.PORT, dst="10.99.0.9")):   # a repair, say
        verdict, out = bpfsys.test_run_output(rack.program.fds[mcast.FUNCTION], frame)
        assert verdict == TC_ACT_UNSPEC and out == frame
    assert rack.stats() == before


# --- over real veths: a rack (a bridge), the PS's namespace and three workers' ---------
NUD_PERMANENT = 0x80
PS_IP = "10.99.0.1"


@dataclass
class Fabric:
    rack: str
    ps: str
    workers: list[str]      # namespaces; worker w is 10.99.0.<w + 2> on port p<w>
    macs: dict[str, str]    # namespace -> its eth0's MAC


def _ip(w: int) -> str:
    return f"10.99.0.{w + 2}"


@pytest.fixture
def fabric():
    base = f"tailcut-mcasttest-{os.getpid()}"
    f = Fabric(f"{base}.rack", f"{base}.ps", [f"{base}.w{w}" for w in range(3)], {})
    names = [f.rack, f.ps, *f.workers]
    try:
        for ns in names:
            netns.create(ns)
            with netns.entered(ns), open("/proc/sys/net/ipv6/conf/all/disable_ipv6", "w") as c:
                c.write("1")
        with netns.ipr(f.rack) as ipr:
            ipr.link("add", ifname="tor", kind="bridge")
            bridge = ipr.link_lookup(ifname="tor")[0]
            ipr.link("set", index=bridge, state="up")
            for port, ns in [("pp", f.ps)] + [(f"p{w}", n) for w, n in enumerate(f.workers)]:
                ipr.link("add", ifname=port, kind="veth",
                         peer={"ifname": "eth0", "net_ns_fd": netns.path(ns)})
                ipr.link("set", index=ipr.link_lookup(ifname=port)[0], master=bridge,
                         state="up")
        ips = {f.ps: PS_IP, **{n: _ip(w) for w, n in enumerate(f.workers)}}
        for ns, ip in ips.items():
            with netns.ipr(ns) as ipr:
                index = ipr.link_lookup(ifname="eth0")[0]
                ipr.addr("add", index=index, address=ip, prefixlen=24)
                ipr.link("set", index=index, state="up")
                f.macs[ns] = ipr.get_links(index)[0].get_attr("IFLA_ADDRESS")
        for ns in ips:   # permanent neighbours: no ARP in the counts
            with netns.ipr(ns) as ipr:
                index = ipr.link_lookup(ifname="eth0")[0]
                for other, ip in ips.items():
                    if other != ns:
                        ipr.neigh("replace", dst=ip, lladdr=f.macs[other], ifindex=index,
                                  state=NUD_PERMANENT)
        with netns.ipr(f.ps) as ipr:
            ipr.neigh("replace", dst=ADDRESS, lladdr="02:74:63:6d:63:73",
                      ifindex=ipr.link_lookup(ifname="eth0")[0], state=NUD_PERMANENT)
        _wait_forwarding(f.rack)
        yield f
    finally:
        for ns in names:
            netns.remove(ns)


def _wait_forwarding(ns: str, timeout_s: float = 5.0) -> None:
    import time
    deadline = time.monotonic() + timeout_s
    with netns.ipr(ns) as ipr:
        while time.monotonic() < deadline:
            links = [link for link in ipr.get_links()
                     if link.get_attr("IFLA_IFNAME") not in ("lo", "tor")]
            if all(link.get_attr("IFLA_OPERSTATE") == "UP" for link in links):
                return   # (no STP: an up port forwards at once)
            time.sleep(0.01)
    raise TimeoutError(f"{ns}: ports not forwarding after {timeout_s} s")


def _serving(f: Fabric, elements: int) -> mcast.Replicator:
    r = mcast.Replicator(job=JOB, rack=RACK, elements=elements, address=ADDRESS)
    r.attach(f.rack, "pp", "ps")
    for w, ns in enumerate(f.workers):
        r.attach(f.rack, f"p{w}", "worker", worker=w, mac=f.macs[ns], ip=_ip(w))
    return r


def _receivers(f: Fabric) -> list[socket.socket]:
    out = []
    for ns in f.workers:
        with netns.entered(ns):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, wire_mcast.SO_RCVBUFFORCE, 8 << 20)
        s.bind(("0.0.0.0", fmt.PORT))
        s.settimeout(1.0)
        out.append(s)
    return out


@pytest.mark.netns
def test_each_params_is_copied_exactly_once_to_every_workers_port(fabric):
    sent = 40
    with _serving(fabric, ELEMENTS) as r:
        receivers = _receivers(fabric)
        with netns.entered(fabric.ps):
            tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        tx.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
        try:
            for i in range(sent):
                tx.sendto(_params(iteration=i, slot=i % 2), (ADDRESS, fmt.PORT))
            for w, rx in enumerate(receivers):
                got = []
                for _ in range(sent):
                    data, (src, _) = rx.recvfrom(2048)
                    h = wire_mcast.parse(data)
                    assert (src, h.worker, h.rack) == (PS_IP, w, RACK)   # addressed to w
                    got.append(h.iteration)
                assert sorted(got) == list(range(sent))
                rx.settimeout(0.2)
                with pytest.raises(TimeoutError):   # and not one more
                    rx.recvfrom(2048)
            assert r.copies() == {f"{fabric.rack}/pp": 0,
                                  **{f"{fabric.rack}/p{w}": sent for w in range(3)}}
            assert {k: v for k, v in r.stats().items() if v} == {"replicated": sent}
        finally:
            tx.close()
            for rx in receivers:
                rx.close()


@pytest.mark.netns
def test_a_copy_lost_on_a_workers_port_is_repaired_by_the_ps(fabric):
    elements = 20 * fmt.STRIDE + 7
    model = np.random.default_rng(1).standard_normal(elements).astype(np.float32)
    with _serving(fabric, elements) as r, \
            dropper.attach(fabric.rack, "p1", 0.3) as lossy:
        with netns.entered(fabric.ps):
            publisher = wire_mcast.Publisher(JOB, elements, [ADDRESS], bind=PS_IP)
        receivers = []
        for w, ns in enumerate(fabric.workers):
            with netns.entered(ns):
                receivers.append(wire_mcast.Receiver(JOB, w, elements, PS_IP))
        try:
            publisher.publish(5, model)
            for w, receiver in enumerate(receivers):
                params = np.zeros(elements, dtype=np.float32)
                repaired = receiver.receive(5, params, timeout_s=10.0)
                assert np.array_equal(params, model)   # every slot, bit for bit
                assert (repaired > 0) == (w == 1), (w, repaired)
            _, dropped = lossy.counts()
            assert dropped > 0
            assert publisher.stats.repaired_slots >= receivers[1].stats.repaired
            assert r.stats()["replicated"] == fmt.slots(elements)
        finally:
            publisher.close()
            for receiver in receivers:
                receiver.close()
