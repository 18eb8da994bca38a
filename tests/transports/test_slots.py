"""The ToR protocols' slot datagrams by sendmmsg/recvmmsg: byte for byte what the
per-datagram packers made, and a worker's multicast receiver takes a batch of copies in
place while refusing hostile ones, each counted, none written outside the model."""

import socket

import numpy as np
import pytest

from tailcut.datapath import aggformat, mcastformat
from tailcut.transports import agg, mcast, slots


@pytest.fixture
def receiver_socket():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(2)
    yield sock
    sock.close()


def test_both_protocols_headers_have_the_layout_sent() -> None:
    slots.check_layout(aggformat.header())
    slots.check_layout(mcastformat.header())
    assert slots.HEADER.itemsize == 32


def test_the_adds_of_a_gradient_are_the_bytes_the_packer_made(receiver_socket) -> None:
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    elements = 2 * aggformat.STRIDE + 17  # two whole slots and a short one
    out = slots.Outgoing(sender, [receiver_socket.getsockname()],
                         magic=aggformat.const("MAGIC"), version=aggformat.const("VERSION"),
                         op=aggformat.ADD, job=0xABCD, worker=5, elements=elements,
                         stride=aggformat.STRIDE, dtype="<i4")
    fixed = np.arange(elements, dtype="<i4") - 300
    for iteration in (7, 8):  # the buffers are reused: the second send is the second's
        out.put(iteration, fixed + iteration)
        out.send()
        for s in range(3):
            lo = s * aggformat.STRIDE
            hi = min(elements, lo + aggformat.STRIDE)
            want = agg.packet(aggformat.ADD, worker=5, job=0xABCD, iteration=iteration,
                              slot=s, payload=(fixed[lo:hi] + iteration).tobytes())
            assert receiver_socket.recv(65536) == want
    sender.close()


def test_a_repair_is_the_slots_copy_for_one_worker() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        out = slots.Outgoing(sender, [("127.0.0.1", 9)], magic=mcastformat.const("MAGIC"),
                             version=mcastformat.const("VERSION"), op=mcastformat.PARAMS,
                             job=3, worker=0, elements=400, stride=mcastformat.STRIDE,
                             dtype="<f4")
        values = np.linspace(-1, 1, 400, dtype=np.float32)
        out.put(11, values)
        want = mcast.packet(mcastformat.PARAMS, job=3, iteration=11, slot=1,
                            payload=values[360:].tobytes(), count=40, worker=6)
        assert out.datagram(1, worker=6) == want


def test_the_multicast_receiver_takes_a_batch_and_refuses_hostile_copies() -> None:
    elements = 3 * mcastformat.STRIDE + 5
    rx = mcast.Receiver(job=9, worker=1, elements=elements, ps="127.0.0.1",
                        bind="127.0.0.3")
    try:
        model = np.linspace(0, 1, elements, dtype=np.float32)
        params = np.full(elements + 8, -7.0, dtype=np.float32)  # a guard after the model
        view = params[:elements]
        magic, version = mcastformat.const("MAGIC"), mcastformat.const("VERSION")
        header = mcastformat.header()

        def copy(slot, iteration=4, job=9, count=None, payload=None, op=mcastformat.PARAMS,
                 m=magic):
            lo = slot * mcastformat.STRIDE
            n = mcastformat.slot_length(elements, slot) if count is None else count
            body = model[lo:lo + n].tobytes() if payload is None else payload
            return header.pack(m, version, op, 0, 0, job, iteration, slot, n, 0, 0) + body

        hostile = [b"\x00" * 5,                                   # shorter than a header
                   copy(0, m=0xDEADBEEF),                          # not ours
                   copy(0, job=8),                                 # another job
                   copy(99, count=360, payload=b"\x01" * 1440),     # slot past the model
                   copy(3, count=360, payload=b"\x01" * 1440),     # last slot, too long
                   copy(1, count=361, payload=b"\x01" * 1444),     # count past a slot
                   copy(2)[:-4],                                   # length != count
                   copy(0, op=mcastformat.REPAIR),                 # wrong op
                   copy(0) + b"\x00" * 4000]                       # longer than any copy
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as ps:
            for data in hostile + [copy(s) for s in range(4)] + [copy(1, iteration=3)]:
                ps.sendto(data, ("127.0.0.3", mcastformat.PORT))
            got = np.zeros(rx.slots, dtype=bool)
            for _ in range(50):
                rx._drain(4, view, got)
                if got.all():
                    break
                rx._wait(0.05)
        assert got.all()
        np.testing.assert_array_equal(view, model)
        assert (params[elements:] == -7.0).all()  # nothing past the model
        assert rx.stats.malformed == len(hostile)
        assert rx.stats.stale == 1 and rx.stats.copies == 4
    finally:
        rx.close()
