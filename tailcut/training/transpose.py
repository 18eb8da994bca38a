"""All-reduce over tailcut's own datagram transports: ``syncMode: allreduce`` with
``transport.type`` bounded-loss or udp. No PS and no Gloo: a transpose all-reduce.

Rank r of N owns a contiguous 1/N of the flat parameters (``ps.shard_range``, as a PS
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

Over bounded-loss both steps take at least p of each message (minP with early close),
as a PS job does: a coordinate of PUSH that did not arrive is left out of the mean,
one of PARAMS keeps the copy's older value (the rank that owns it has the latest). So the model is the
ranks' own shards together; rank 0 evaluates its copy, as a PS worker's copy,
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
from tailcut.training import aggregation, allreduce, cpustats, peers, ps, records, worker
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
    accepted = transport.listen(host, port, world - 1 - rank, peers.left(deadline))
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
    ranges = [ps.shard_range(model.num_params, world, k) for k in range(world)]
    lo, hi = ranges[rank]
    # Every rank sends to rank+1 first, then rank+2, ...: the ranks' first messages
    # usually form a permutation, not N-1 senders converging on rank 0.
    others = [(rank + i) % world for i in range(1, world)]
    deadline = time.monotonic() + cfg.timeout_s + worker.GRACE_S
    options = {k: v for k, v in cfg.transport.items() if k != "type"}
    transport = transports.get(cfg.transport["type"], **options)
    conns: dict[int, base.Connection] = {}
    try:
        with records.CsvLog(results / records.messages_filename("worker", rank),
                            records.MESSAGE_FIELDS) as messages, \
                records.CsvLog(results / allreduce.filename(rank), allreduce.FIELDS) as log, \
                allreduce.EpochLog(results, rank) as epochs:
            try:
                connect(transport, cfg, deadline, conns)
            except base.TransportError as err:
                raise errors.RunError(f"worker {rank}: could not reach the other ranks: "
                                      f"{err}") from err
            mesh = _Peers(conns, messages, rank, cfg.timeout_s + worker.GRACE_S)
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
                for k in others:
                    a, b = ranges[k]
                    mesh.send(k, Message(Kind.PUSH, step, rank, grad[a:b]))
                # float64: the sum of N float32 gradients, divided once (combine)
                total = grad[lo:hi].astype(np.float64)
                counts = np.ones(hi - lo, dtype=np.int32)
                for k in others:
                    push = mesh.take(k, (Kind.PUSH,), step)
                    _add(total, counts, push, hi - lo, k)
                direction, _ = aggregation.combine(total, counts, cfg.aggregation)
                params[lo:hi] -= np.float32(cfg.learning_rate) * direction
                for k in others:
                    mesh.send(k, Message(Kind.PARAMS, step, rank, params[lo:hi]))
                for k in others:
                    a, b = ranges[k]
                    worker.apply_params(params[a:b], _sized(
                        mesh.take(k, (Kind.PARAMS,), step), b - a, k))
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


def _sized(msg: Message, size: int, rank: int) -> Message:
    """``msg`` (a PUSH or PARAMS from ``rank``), if it has the ``size`` values of its shard."""
    if msg.values.size != size:
        raise errors.RunError(f"worker {rank}'s {msg.kind.name} has {msg.values.size} "
                              f"values; its shard has {size}")
    return msg


def _add(total: np.ndarray, counts: np.ndarray, push: Message, size: int, rank: int) -> None:
    """Add the coordinates of ``push`` that arrived to ``total`` and ``counts``."""
    _sized(push, size, rank)
    if push.mask is None:
        total += push.values
        counts += 1
    else:
        total[push.mask] += push.values[push.mask]
        counts += push.mask
