"""sendmmsg batches: every datagram goes out whole, in the given order, once."""

import socket

import numpy as np

from tailcut.transports import batch


def test_a_batch_sends_the_chosen_rows_in_order_with_their_lengths() -> None:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(2)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        raw = np.arange(10 * 64, dtype=np.uint8).reshape(10, 64)
        lengths = np.array([64, 10, 20, 30, 40, 50, 60, 1, 2, 3])
        order = np.array([7, 2, 9, 0, 5])
        b = batch.Batch(tx, raw, lengths, order, rx.getsockname())
        b.send(0, 2)
        b.send(2, 3)
        got = [rx.recv(100) for _ in range(5)]
        assert got == [bytes(raw[r, :lengths[r]]) for r in order]
    finally:
        rx.close()
        tx.close()


def test_sendmmsg_is_found_in_libc() -> None:
    assert batch.available()
