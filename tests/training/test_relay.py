"""The rack-aware transpose's plan (training.relay) and one iteration of it
(transpose._Exchange) run by every rank at once over in-memory queues: a unit test of
who sends what to whom. The real transport's runs are in test_transpose.py."""

from __future__ import annotations

import queue
import threading

import numpy as np
import pytest

from tailcut.training import relay, transpose
from tailcut.training.shards import shard_range
from tailcut.transports.base import Kind, Message

LAYOUTS = {"one rack": [0, 0, 0, 0], "a rank per rack": [0, 1, 2, 3],
           "two racks of two": [0, 0, 1, 1], "interleaved": [0, 1, 0, 1],
           "two and one": [0, 0, 1], "three and two": [0, 0, 0, 1, 1],
           "three racks": [1, 0, 1, 0, 2], "labels": [5, 5, 9]}
# Where each rack's size divides the number of shards owned outside it, every rank
# sends 2(N-1)/N of the vector, as in a ring.
EVEN = ("one rack", "a rank per rack", "two racks of two", "interleaved")


class _Mesh:
    """_Peers' send and take over one FIFO per (sender, receiver). ``loss``: each
    coordinate of a message is lost with this probability, and arrives as NaN."""

    def __init__(self, rank: int, queues: dict[tuple[int, int], queue.Queue],
                 loss: float | None = None) -> None:
        self.rank = rank
        self.queues = queues
        self.loss = loss
        self.rng = np.random.default_rng(rank)
        self.sent: list[tuple[int, int]] = []   # (to, values)

    def send(self, rank: int, msg: Message) -> None:
        self.sent.append((rank, msg.values.size))
        values, mask = np.array(msg.values), None
        if self.loss is not None:
            mask = self.rng.random(values.size) >= self.loss
            values[~mask] = np.nan
        self.queues[self.rank, rank].put(Message(msg.kind, msg.iteration, msg.sender,
                                                 values, mask))

    def take(self, rank: int, kinds: tuple[Kind, ...], iteration: int) -> Message:
        msg = self.queues[rank, self.rank].get(timeout=5)
        assert msg.kind in kinds and msg.iteration == iteration
        return msg


def _iteration(racks: list[int], params: np.ndarray, grads: list[np.ndarray],
               loss: float | None = None) -> tuple[list[np.ndarray], list[_Mesh]]:
    """One iteration of every rank at once: their copies after it, and their meshes."""
    world = len(racks)
    queues: dict[tuple[int, int], queue.Queue] = {
        (a, b): queue.Queue() for a in range(world) for b in range(world)}
    copies = [params.copy() for _ in range(world)]
    meshes = [_Mesh(r, queues, loss) for r in range(world)]
    layout = relay.Racks.of(world, racks)
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            exchange = transpose._Exchange(meshes[r], layout, params.size, np.float32(0.5),
                                           "mean")
            exchange.step(grads[r], copies[r], 0)
        except BaseException as err:   # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors and not any(t.is_alive() for t in threads)
    assert all(q.empty() for q in queues.values())
    return copies, meshes


def _inputs(world: int, size: int = 103) -> tuple[np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(7)
    return (rng.standard_normal(size).astype(np.float32),
            [rng.standard_normal(size).astype(np.float32) for _ in range(world)])


@pytest.mark.parametrize("racks", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_every_rank_ends_with_the_mean_gradient_step_and_sends_what_a_ring_sends(racks):
    world, size = len(racks), 103   # shards of 20 and 21 values
    params, grads = _inputs(world, size)
    copies, meshes = _iteration(racks, params, grads)
    layout = relay.Racks.of(world, racks)
    expected = params - np.float32(0.5) * (np.sum(grads, axis=0, dtype=np.float64)
                                           / world).astype(np.float32)
    for r in range(world):
        np.testing.assert_allclose(copies[r], expected, rtol=1e-5, atol=1e-6)
    # N-1 copies of each shard's gradient and of its parameters in all, as a ring or
    # the plain transpose sends; at most one message per peer and step
    assert sum(n for m in meshes for _, n in m.sent) == 2 * (world - 1) * size
    assert all(len(m.sent) <= 2 * (world - 1) for m in meshes)
    rack_of = layout.rack_of
    for a in set(rack_of):
        for b in set(rack_of) - {a}:   # what crosses between two racks: one vector each way
            crossing = sum(n for r in range(world) if rack_of[r] == a
                           for to, n in meshes[r].sent if rack_of[to] == b)
            assert crossing == sum(_shard_size(size, world, k) for k in range(world)
                                   if rack_of[k] in (a, b))


def _shard_size(size: int, world: int, k: int) -> int:
    lo, hi = shard_range(size, world, k)
    return hi - lo


def test_one_rack_or_a_rank_per_rack_is_the_plain_transpose():
    for racks in ([0, 0, 0, 0], [0, 1, 2, 3]):
        layout = relay.Racks.of(4, racks)
        for r in range(4):
            # every other rank gets its piece of my gradient and my shard from me
            receivers = set(layout.peers(r)) | set(layout.relayed(r))
            assert receivers == {k for k in range(4) if k != r}
    assert relay.Racks.of(3, None).rack_of == (0, 0, 0)


@pytest.mark.parametrize("name", EVEN)
def test_where_racks_divide_evenly_every_rank_sends_what_a_ring_rank_sends(name):
    racks = LAYOUTS[name]
    world = len(racks)
    params, grads = _inputs(world, size=104)   # equal shards of 26
    _, meshes = _iteration(racks, params, grads)
    for m in meshes:
        assert sum(n for _, n in m.sent) == 2 * (world - 1) * 26


@pytest.mark.parametrize("racks", [LAYOUTS["two racks of two"], LAYOUTS["three and two"]],
                         ids=["two racks of two", "three and two"])
def test_what_did_not_arrive_is_left_out_not_summed(racks):
    """A lost coordinate arrives as NaN: a wrong mask slice anywhere (a relay's gather,
    its sum, a scatter of several shards) would carry one into a rank's copy."""
    params, grads = _inputs(len(racks))
    copies, _ = _iteration(racks, params, grads, loss=0.2)
    assert all(np.isfinite(c).all() for c in copies)
    assert any((c != params).any() for c in copies)
    # with nothing lost but every message masked, the masked arithmetic is the mean step
    masked, _ = _iteration(racks, params, grads, loss=0.0)
    plain, _ = _iteration(racks, params, grads)
    for a, b in zip(masked, plain):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_a_model_too_big_for_one_message_is_refused_before_connecting():
    racks = relay.Racks.of(4, [0, 0, 1, 1])
    assert racks.largest([10, 10, 10, 11]) == 21   # a gather: own shard and a relayed one
    # a rank alone in its rack (rank 0) sends and gets one shard a message
    assert relay.Racks.of(3, [0, 1, 1]).largest([5, 6, 7]) == 11   # to rank 1: shards 0, 1
    assert relay.Racks.of(4, [0, 1, 2, 3]).largest([5, 5, 5, 6]) == 6   # plain transpose
    transpose._check_fits(racks, 41, 21)
    with pytest.raises(transpose.errors.RunError,
                       match="messages hold up to 21 values, the transport at most 20"):
        transpose._check_fits(racks, 41, 20)
