"""All-reduce over tailcut's own datagram transports: ``syncMode: allreduce`` with
``transport.type`` bounded-loss or udp. No PS and no Gloo: a transpose all-reduce.

Rank r of N owns a contiguous 1/N of the flat parameters (``shards.shard_range``, as a PS
shard would) and keeps a copy of the rest. Every iteration, on every rank at once:

    the gradient of its next minibatch, on its copy
    PUSH   grad[shard k] to every other rank k           (reduce-scatter, one step)
    combine what arrived for its own shard with its own gradient, coordinate by
    coordinate (``aggregation.combine``: the PS's rule), and step it: w -= lr * that
    PARAMS w[shard r] to every other rank                (all-gather, one step)
    write what arrived of each other shard into its copy; keep the rest

Two steps of N-1 messages of 1/N of the vector each, handed to the transport at once
(its scheduler, srpt.py, orders them on the rank's link), where a ring takes 2(N-1)
steps in a chain: a late or lost packet delays one message, not every step after it.
The bytes per rank are a ring's: 2(N-1)/N of the vector out and in. This is
OptiReduce's Transpose AllReduce (NSDI'25), without its Hadamard transform.

With ranks in several racks (``rank_racks``), one rank of each rack relays each shard
owned in another rack (relay.py): its rack peers PUSH it their pieces with the ones
for its own shard, it sends the owner the rack's sum, takes the owner's PARAMS and
hands them on with its own. So each uplink carries one vector each way per
iteration, not one per rank of the rack, in four steps of one message per peer.

Over bounded-loss every step takes at least p of each message (minP with early close),
as a PS job does: a coordinate of PUSH that did not arrive is left out of the mean (a
relay's sum holds the mean of what its rack delivered, times the rack's size), one of
PARAMS keeps the copy's older value (the rank that owns it has the latest). So the
model is the ranks' own shards together; rank 0 evaluates its copy, as a PS worker's copy,
typically an iteration or two old in the coordinates it missed.

Rank 0 reports as the Gloo ranks do (tailcut.training.allreduce): events, epochs.csv,
``allreduce-worker-<i>.csv`` (``buckets`` is 1: the whole vector at once), and every
rank ``messages-worker-<i>.csv`` with each PUSH and PARAMS it received, what was
missing and how many repair rounds it took. Rank 0 says go on (ACK) or STOP at each
epoch boundary and every ``allreduce.VERDICT_EVERY`` iterations; a rank closes once
every peer has said STOP, i.e. has all it needs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tailcut import errors, transports
from tailcut.training import (aggregation, allreduce, cpustats, peers, ps, records, relay,
                              syncmodes, worker)
from tailcut.training import shards
from tailcut.training.config import RoleConfig
from tailcut.transports import base
from tailcut.transports.base import Kind, Message

Emit = Callable[[dict[str, Any]], None]
NAME = "transpose"   # the "allreduce" of the start event: which algorithm ran


_KINDS = (Kind.PUSH, Kind.PARAMS, Kind.ACK, Kind.STOP)


class _Peers:
    """The connections to the other ranks, and what came early: a peer's next
    iteration's PUSH may arrive while this rank still gathers this one's PARAMS, and
    a control frame (ACK, STOP) may overtake a message still coming in.

    Every send and receive may take ``wait_s``, as each of Gloo's operations may: a
    job past its timeoutS stops at rank 0's next verdict, not here."""

    def __init__(self, conns: dict[int, base.Connection], log: records.CsvLog,
                 rank: int, wait_s: float) -> None:
        self.conns = conns
        self.log = log
        self.rank = rank
        self.wait_s = wait_s
        self.early: dict[tuple[int, Kind, int], Message] = {}

    def send(self, rank: int, msg: Message) -> None:
        self._guard(rank, lambda: self.conns[rank].send(msg, self.wait_s))

    def take(self, rank: int, kinds: tuple[Kind, ...], iteration: int) -> Message:
        """The message of one of ``kinds`` for ``iteration`` from ``rank``."""
        for kind in kinds:
            waiting = self.early.pop((rank, kind, iteration), None)
            if waiting is not None:
                return waiting
        while True:
            msg: Message = self._guard(rank, lambda: self.conns[rank].recv(self.wait_s))
            if msg.kind in (Kind.PUSH, Kind.PARAMS):
                self.log.write(records.message_row(msg, self.rank))
            if msg.kind in kinds and msg.iteration == iteration:
                return msg
            if msg.kind not in _KINDS:
                raise errors.RunError(f"worker {rank} sent {msg.kind.name}; all-reduce "
                                      f"ranks send {'/'.join(k.name for k in _KINDS)}")
            if msg.iteration > iteration + 1:   # a rank runs at most one iteration ahead
                raise errors.RunError(f"worker {rank} sent {msg.kind.name} for iteration "
                                      f"{msg.iteration} while worker {self.rank} waited "
                                      f"for {'/'.join(k.name for k in kinds)} of {iteration}")
            if (rank, msg.kind, msg.iteration) in self.early:
                raise errors.RunError(f"worker {rank} sent {msg.kind.name} for iteration "
                                      f"{msg.iteration} twice")
            if msg.iteration < iteration:
                raise errors.RunError(f"worker {rank} sent {msg.kind.name} for iteration "
                                      f"{msg.iteration} while worker {self.rank} waited "
                                      f"for {'/'.join(k.name for k in kinds)} of {iteration}")
            self.early[(rank, msg.kind, msg.iteration)] = msg

    def _guard(self, rank: int, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except base.PeerClosed as err:
            raise worker.PSGone(f"worker {rank} went away: {err}") from err
        except base.TransportTimeout as err:   # silent that long: gone, as a worker says
            raise worker.PSGone(f"worker {rank} did not answer in time: {err}") from err
        except base.TransportError as err:
            raise errors.RunError(f"all-reduce with worker {rank} failed: {err}") from err


def connect(transport: base.Transport, cfg: RoleConfig, deadline: float,
            conns: dict[int, base.Connection]) -> None:
    """One connection to every other rank, into ``conns`` as each is made (the caller
    closes them, also after a failure here): listen for the higher ranks, then connect
    to the lower ones (rank N-1 listens for none). Listening first opens the UDP
    socket on this rank's own endpoint, which the connections then share."""
    rank, world = cfg.index, cfg.num_workers
    host, port = cfg.shards[rank]
    accepted = peers.listen(transport, host, port, world - 1 - rank, deadline)
    conns.update({-1 - i: conn for i, conn in enumerate(accepted)})   # not named yet
    named = peers.accept(transport, accepted,
                         {f"worker-{k}" for k in range(rank + 1, world)}, deadline)
    conns.clear()
    conns.update({int(who.split("-")[1]): conn for who, conn in named.items()})
    for k in range(rank):
        h, p = cfg.shards[k]
        conns[k] = peers.hello(transport, h, p, peers.WORKER, rank, deadline)
        conns[k].peer = f"worker {k} ({h}:{p})"


def run(cfg: RoleConfig, emit: Emit) -> dict[str, Any]:
    """Train as rank ``cfg.index`` to the end; rank 0 emits the job's events and returns
    its "done" event, the others their "worker_done"."""
    if cfg.num_shards != cfg.num_workers:
        raise errors.RunError(f"allreduce over {cfg.transport['type']}: needs one endpoint "
                              f"per rank, got {cfg.num_shards} for {cfg.num_workers} ranks")
    results = Path(cfg.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    dataset, model, x, y, batches, ipe = allreduce.rank_inputs(cfg)
    rank, world = cfg.index, cfg.num_workers
    params = model.init_params(np.random.default_rng(cfg.seed))
    others = [k for k in range(world) if k != rank]
    deadline = time.monotonic() + cfg.timeout_s + worker.GRACE_S
    options = {k: v for k, v in cfg.transport.items() if k != "type"}
    transport = transports.get(cfg.transport["type"], **options)
    conns: dict[int, base.Connection] = {}
    try:
        with records.CsvLog(results / records.messages_filename("worker", rank),
                            records.MESSAGE_FIELDS) as messages, \
                records.CsvLog(results / allreduce.filename(rank), allreduce.FIELDS) as log, \
                allreduce.EpochLog(results, rank) as epochs:
            racks = relay.Racks.of(world, cfg.rank_racks)
            _check_fits(racks, model.num_params, getattr(transport, "message_limit", None))
            try:
                connect(transport, cfg, deadline, conns)
            except base.TransportError as err:
                raise errors.RunError(f"worker {rank}: could not reach the other ranks: "
                                      f"{err}") from err
            mesh = _Peers(conns, messages, rank, cfg.timeout_s + worker.GRACE_S)
            exchange = _Exchange(mesh, racks, model.num_params,
                                 np.float32(cfg.learning_rate), cfg.aggregation)
            if rank == 0:
                emit({"event": "start", "num_params": model.num_params,
                      "iterations_per_epoch": ipe, "model": cfg.model,
                      "sync_mode": "allreduce", "allreduce": NAME,
                      "transport": cfg.transport["type"], "workers": world})
            cpustats.mark()   # connected: what follows is training's CPU
            job_deadline = time.monotonic() + cfg.timeout_s
            started = time.monotonic()
            epoch, step, stop_reason, last_eval = 0, 0, "", (float("nan"), float("nan"))
            while True:
                rows = next(batches)
                t0 = time.perf_counter()
                _, grad = model.loss_and_grad(params, x[rows], y[rows])
                t1 = time.perf_counter()
                exchange.step(grad, params, step)
                t2 = time.perf_counter()
                step += 1
                log.write({"step": step - 1, "compute_ms": round((t1 - t0) * 1e3, 3),
                           "allreduce_ms": round((t2 - t1) * 1e3, 3),
                           "iteration_ms": round((t2 - t0) * 1e3, 3), "buckets": 1})
                at_max = cfg.max_iterations is not None and step >= cfg.max_iterations
                # Between verdicts (allreduce.verdict_due) the iterations run back to back.
                if not allreduce.verdict_due(step, ipe, at_max):
                    continue
                if rank == 0:
                    if step % ipe == 0:
                        epoch += 1
                        last_eval = epochs.evaluate(model, params, dataset, epoch, step,
                                                    time.monotonic() - started, emit)
                    stop_reason = allreduce.verdict(cfg, epoch, last_eval[1], at_max,
                                                     job_deadline)
                    verdict = Kind.STOP if stop_reason else Kind.ACK   # ACK: go on
                    for k in others:
                        mesh.send(k, Message(verdict, step, rank))
                    if stop_reason:
                        break
                elif mesh.take(0, (Kind.ACK, Kind.STOP), step).kind == Kind.STOP:
                    for k in others:
                        mesh.send(k, Message(Kind.STOP, step, rank))
                    break
            jct_s = time.monotonic() - started
            # A STOP says its sender has every message it needs from this rank, which
            # may close then (rank 0's verdict was its own).
            for k in others:
                if k != 0:
                    mesh.take(k, (Kind.STOP,), step)
    finally:
        cpustats.checkpoint()   # the transport's threads end with it
        for conn in conns.values():
            conn.close()
        transport.close()
    return allreduce.closing_event(cfg, model, params, dataset, epoch, step, stop_reason,
                                   jct_s, last_eval, allreduce=NAME)


class _Exchange:
    """One iteration's all-reduce as this rank does it (relay.py: the four steps)."""

    def __init__(self, mesh: _Peers, racks: relay.Racks, num_params: int,
                 learning_rate: np.float32, rule: str) -> None:
        self.mesh = mesh
        rank = self.rank = mesh.rank
        world = len(racks.rack_of)
        self.ranges = _ranges(num_params, world)
        # rank+1 first, then rank+2, ...: the ranks' first messages usually form a
        # permutation, not N-1 senders converging on rank 0.
        self.rack_peers = sorted(racks.peers(rank), key=lambda r: (r - rank) % world)
        self.relayed = racks.relayed(rank)
        self.handles = racks.handles(rank)
        self.peer_handles = {t: racks.handles(t) for t in self.rack_peers}
        self.relays = {r: racks.size(r) for r in racks.relays_of(rank)}   # -> rack size
        self.rack_size = racks.size(rank)
        self.learning_rate = learning_rate
        self.rule = rule

    def step(self, grad: np.ndarray, params: np.ndarray, step: int) -> None:
        """Average ``grad`` with the other ranks' and step ``params`` in place: this
        rank's shard by itself, the others as their owners send them."""
        mesh, rank, ranges = self.mesh, self.rank, self.ranges
        for t in self.rack_peers:   # 1 gather
            mesh.send(t, Message(Kind.PUSH, step, rank,
                                 _pieces(grad, ranges, self.peer_handles[t])))
        # float64: the sum of N float32 gradients, divided once (combine)
        sums = {k: grad[ranges[k][0]:ranges[k][1]].astype(np.float64) for k in self.handles}
        counts = {k: np.ones(sums[k].size, dtype=np.int32) for k in self.handles}
        for i in self.rack_peers:
            push = mesh.take(i, (Kind.PUSH,), step)
            for k, piece in _split(push, ranges, self.handles, i):
                syncmodes.accumulate(sums[k], counts[k], piece, piece.values.size, 1)
        for k in self.relayed:   # 2 reduce
            mesh.send(k, Message(Kind.PUSH, step, rank,
                                 _rack_sum(sums[k], counts[k], self.rack_size)))
        total, count = sums[rank], counts[rank]
        for r, size in self.relays.items():
            push = mesh.take(r, (Kind.PUSH,), step)
            for _, piece in _split(push, ranges, [rank], r):
                syncmodes.accumulate(total, count, piece, piece.values.size, size)
        direction, _ = aggregation.combine(total, count, self.rule)
        lo, hi = ranges[rank]
        params[lo:hi] -= self.learning_rate * direction
        for r in self.relays:   # 3 broadcast
            mesh.send(r, Message(Kind.PARAMS, step, rank, params[lo:hi]))
        for k in self.relayed:
            for _, piece in _split(mesh.take(k, (Kind.PARAMS,), step), ranges, [k], k):
                worker.apply_params(params[ranges[k][0]:ranges[k][1]], piece)
        if self.rack_peers:   # 4 scatter
            mine = _pieces(params, ranges, self.handles)
            for t in self.rack_peers:
                mesh.send(t, Message(Kind.PARAMS, step, rank, mine))
        for i in self.rack_peers:
            got = mesh.take(i, (Kind.PARAMS,), step)
            for k, piece in _split(got, ranges, self.peer_handles[i], i):
                worker.apply_params(params[ranges[k][0]:ranges[k][1]], piece)


def _ranges(num_params: int, world: int) -> list[tuple[int, int]]:
    return [shards.shard_range(num_params, world, k) for k in range(world)]


def _check_fits(racks: relay.Racks, num_params: int, message_limit: int | None) -> None:
    """Refuse a model whose messages the transport cannot carry, before connecting
    (every rank finds the same)."""
    world = len(racks.rack_of)
    largest = racks.largest([b - a for a, b in _ranges(num_params, world)])
    if message_limit is not None and largest > message_limit:
        raise errors.RunError(
            f"a model of {num_params} parameters over {world} ranks in racks "
            f"{list(racks.rack_of)}: the all-reduce's messages hold up to {largest} "
            f"values, the transport at most {message_limit} (more ranks, or a larger "
            f"mtu, make them fit)")


def _pieces(vector: np.ndarray, ranges: list[tuple[int, int]], shards: list[int]) -> np.ndarray:
    """The shards ``shards`` of ``vector``, one after the other (one message)."""
    if len(shards) == 1:
        a, b = ranges[shards[0]]
        return vector[a:b]
    return np.concatenate([vector[ranges[k][0]:ranges[k][1]] for k in shards])


def _split(msg: Message, ranges: list[tuple[int, int]], shards: list[int], rank: int
           ) -> list[tuple[int, Message]]:
    """(shard, its piece of ``msg``) for each of ``shards`` in ``msg`` from ``rank``."""
    sizes = [ranges[k][1] - ranges[k][0] for k in shards]
    if msg.values.size != sum(sizes):
        raise errors.RunError(f"worker {rank}'s {msg.kind.name} has {msg.values.size} "
                              f"values; shard{'s' if len(shards) > 1 else ''} "
                              f"{', '.join(map(str, shards))} hold {sum(sizes)}")
    out: list[tuple[int, Message]] = []
    offset = 0
    for k, size in zip(shards, sizes):
        mask = None if msg.mask is None else msg.mask[offset:offset + size]
        out.append((k, Message(msg.kind, msg.iteration, msg.sender,
                               msg.values[offset:offset + size], mask)))
        offset += size
    return out


def _rack_sum(total: np.ndarray, counts: np.ndarray, rack_size: int) -> np.ndarray:
    """What a relay sends the owner: its rack's sum of a shard, each coordinate's mean
    over the rack's gradients that arrived times the rack's size (the relay's own is
    always there), so that the owner counts it as ``rack_size`` gradients."""
    rack_sum: np.ndarray = (total / counts * rack_size).astype(np.float32)
    return rack_sum
