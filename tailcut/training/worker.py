"""Worker role: pull the model from every PS shard, push the gradient of one minibatch.

The worker connects to every shard (and to the PS replica and its aggregator, if
the job has them; retrying: they may start later) and says HELLO, which is its
pull for step 0. Then, until a STOP: wait for PARAMS(k) from every shard (shard
0's may come from the replica once the primary is gone), compute the gradient of
the next ``batch_size`` examples of its shard, PUSH(k) each shard its range (or
the whole gradient to its aggregator, which sums its group), and PULL(k+1).

Layer-wise (policy cadentflow and a model with stages, tailcut.ml.layerwise):
the PS's PARAMS arrive one part per tensor, and the worker computes each layer's
forward pass as soon as that layer's parts are in, while later ones are still in
flight; in the backward pass it pushes each layer's gradient as soon as it is
computed (last layer first), so the push overlaps the rest of the backward pass. The
numbers are those of the whole-model path. Under ``fair``, with aggregators or a
replica, or with a model without stages, the worker computes on the whole model.

Parameter coordinates missing from a PARAMS message keep their previous value;
before the first PARAMS that is the initial value, which the worker computes from
the seed exactly as the PS does. Every push and pull leaves a row in
``rpc-client-worker-<i>.csv`` (see records.CLIENT_RPC_FIELDS).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tailcut import errors, transports
from tailcut.ml import data, layerwise, models
from tailcut.training import cpustats, flows, inbox, peers, ps, records, torkinds
from tailcut.training import shards
from tailcut.training.config import RoleConfig, split_endpoint
from tailcut.transports import base
from tailcut.transports.base import Kind, Message

# A worker waits this much longer than the job's timeout_s before giving up on the
# PS: the PS enforces the job's timeout and may have started after this worker.
GRACE_S = 30.0


class PSGone(errors.RunError):
    """The parameter server (under the transpose all-reduce, another rank) closed the
    connection, broke the protocol or fell silent."""


class _Stopped(Exception):
    """The PS said STOP while a layer-wise forward pass waited for parameters."""


def apply_params(params: np.ndarray, msg: Message) -> None:
    """Overwrite ``params`` with the coordinates ``msg`` delivered; keep the rest."""
    if msg.values.shape != params.shape:
        raise errors.RunError(f"PARAMS has {msg.values.size} values; the model has {params.size}")
    if msg.mask is None:
        params[...] = msg.values
    else:
        params[msg.mask] = msg.values[msg.mask]


def minibatches(num_rows: int, batch_size: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Row indices of successive minibatches, reshuffled on every pass over the shard.

    A pass yields only full batches (the remainder waits for the next shuffle), so
    every gradient averages the same number of examples.
    """
    if num_rows < 1:
        raise errors.RunError("this worker's shard is empty: more workers than training examples")
    size = min(batch_size, num_rows)
    while True:
        order = rng.permutation(num_rows)
        for lo in range(0, num_rows - size + 1, size):
            yield order[lo : lo + size]


def run(cfg: RoleConfig) -> dict[str, Any]:
    """Train until the PS says STOP; return a summary. Raises PSGone if the PS fails."""
    return _Worker(cfg).run()


class _Worker:
    """One worker's connections, model copy and RPC log."""

    def __init__(self, cfg: RoleConfig) -> None:
        self.cfg = cfg
        self.name = f"worker-{cfg.index}"
        self.deadline = time.monotonic() + cfg.timeout_s + GRACE_S
        dataset = models.dataset(cfg.model, cfg.seed)
        self.model = models.create(cfg.model, dataset)
        self.x, self.y = data.shard(dataset.x_train, dataset.y_train, cfg.index, cfg.num_workers)
        # Same seed as the PS's init: a coordinate missing from the first PARAMS then
        # still has the value the PS started from.
        self.params = self.model.init_params(np.random.default_rng(cfg.seed))
        # The ToR kinds the job asks for (spec.network.inNetwork; training.torkinds):
        # what the ToRs hold, sum or copy changes what a worker pulls and pushes. Made
        # before the HELLO (multicast's socket must be open for the first copy).
        self.tor = torkinds.worker_sides(torkinds.WorkerContext(cfg, self.model, dataset))
        self.batches = minibatches(
            len(self.x), cfg.batch_size, np.random.default_rng([cfg.seed, 1 + cfg.index])
        )
        self.ranges = [
            shards.shard_range(self.model.num_params, cfg.num_shards, s) for s in range(cfg.num_shards)
        ]
        self.aggregator = cfg.aggregator_of(cfg.index)
        self.failed_over: dict[str, Any] | None = None
        self.stopped = False  # a STOP was taken while handling a lost server (_stop_follows)
        self.aggregator_gone: base.TransportError = base.PeerClosed("the aggregator went away")
        self.sent: dict[tuple[str, str, int], tuple[int, int]] = {}  # (op, server, step)
        try:  # CadentFlow levels (None: fair, messages go whole and untagged)
            self.pull_levels = flows.levels_for(cfg.flows, "pull", self.model.layers)
            self.push_levels = flows.levels_for(cfg.flows, "push", self.model.layers)
        except ValueError as err:
            raise errors.RunError(str(err)) from None
        # Per-tensor parts both ways over TCP (the datagram transports deliver a tagged
        # message whole, and may cut it short), and no aggregator or replica in between.
        self.layerwise = (self.pull_levels is not None and self.push_levels is not None
                          and layerwise.supports(self.model) and self.aggregator is None
                          and cfg.replica is None and cfg.transport.get("type") == "tcp")
        self._staged: Any = self.model  # with layerwise.STAGE_API when self.layerwise
        self.push_cuts: dict[int, tuple[base.Cut, ...]] = {}  # shard -> its PUSH's cuts
        self.arrived = np.zeros(self.model.num_params if self.layerwise else 0, dtype=bool)
        self.missing: set[int] = set()
        self.early_forwards = 0  # iterations whose forward pass began before PARAMS was whole
        self.compute_s: list[float] = []  # per iteration: time in the model, waits excluded

    def _where(self, who: str) -> str:
        conn = self.conns.get(who)
        return conn.peer if conn is not None else who

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        options = {k: v for k, v in cfg.transport.items() if k != "type"}
        transport = transports.get(cfg.transport["type"], **options)
        where = f"parameter server at {cfg.ps_host}:{cfg.ps_port}"
        self.conns: dict[str, base.Connection] = {}
        pushed = 0
        step = 0
        try:
            with (
                records.CsvLog(
                    Path(cfg.results_dir) / records.messages_filename("worker", cfg.index),
                    records.MESSAGE_FIELDS,
                ) as self.log,
                records.CsvLog(
                    Path(cfg.results_dir) / records.rpc_filename("client", self.name),
                    records.CLIENT_RPC_FIELDS,
                ) as self.rpcs,
                contextlib.ExitStack() as stack,
            ):
                self.flows_log = None if cfg.flows is None else stack.enter_context(
                    records.CsvLog(Path(cfg.results_dir) / flows.filename(self.name),
                                   flows.FIELDS))
                try:
                    targets = [(f"ps-{s}", h, p) for s, (h, p) in enumerate(cfg.shards)]
                    if cfg.replica is not None:
                        targets.append(("replica-0", *cfg.replica))
                    if self.aggregator is not None:
                        host, port = split_endpoint(cfg.aggregators[self.aggregator]["endpoint"])
                        targets.append((f"aggregator-{self.aggregator}", host, port))
                    for who, host, port in targets:
                        conn = transport.connect(host, port, peers.left(self.deadline))
                        conn.peer = f"{who} at {host}:{port}" if who != "ps-0" else where
                        self.conns[who] = conn
                        if self.push_levels is not None and who.startswith("ps-"):
                            shard = int(who.split("-")[1])
                            lo, hi = self.ranges[shard]
                            self.push_cuts[shard] = flows.cuts(self.model.layers, lo, hi,
                                                               self.push_levels)
                            flows.tag(conn, Kind.PUSH, self.push_cuts[shard])
                        if who.startswith("ps-"):  # coflow: the push paced at its MADD rate
                            flows.pace(conn, cfg.flows, self.name, who, Kind.PUSH,
                                       self.model.layers, *self.ranges[int(who.split("-")[1])])
                        # HELLO is the pull for step 0: stamp it as one.
                        self._request(who, Message(Kind.HELLO, peers.WORKER, cfg.index), "pull", 0)
                    self.inbox = inbox.Inbox(list(self.conns.values()), parts=self.layerwise)
                    self.names = list(self.conns)
                    cpustats.mark()  # connected: what follows is training's CPU
                    while self._train_step(step):
                        pushed += 1
                        step += 1
                        for who in self._servers():
                            self._request(who, Message(Kind.PULL, step, cfg.index), "pull", step)
                except base.PeerClosed as err:
                    raise PSGone(f"{where} went away after iteration {step - 1}: {err}") from err
                except base.TransportTimeout as err:
                    raise PSGone(
                        f"{where} did not answer in time (after iteration {step - 1}): {err}"
                    ) from err
                except base.TransportError as err:
                    raise PSGone(f"{where}: {err}") from err
        finally:
            cpustats.checkpoint()  # the transport's threads end with it
            for conn in self.conns.values():
                conn.close()
            transport.close()
        summary: dict[str, Any] = {
            "event": "worker_done",
            "index": cfg.index,
            "pushes": pushed,
            "last_iteration": step - 1,
        }
        if self.compute_s:
            summary["compute_ms_median"] = round(float(np.median(self.compute_s)) * 1e3, 3)
        if self.layerwise:
            summary["layerwise"] = {"early_forward_iterations": self.early_forwards}
        if self.failed_over is not None:
            summary["failed_over"] = self.failed_over
        for side in self.tor:
            tor_summary = side.finish(Path(cfg.results_dir), self.name)
            if tor_summary is not None:
                summary[side.key] = tor_summary
        return summary

    def _servers(self) -> list[str]:
        """Everyone who must see our pulls: the shards and the replica."""
        return [w for w in self.conns if w.startswith(("ps-", "replica-"))]

    def _request(self, who: str, msg: Message, op: str, step: int) -> None:
        """Send a request, remembering t0 and its size for the RPC log."""
        msg.sent_at_ns = time.time_ns()
        try:
            self.conns[who].send(msg, peers.left(self.deadline))
        except base.TransportError as err:
            if who.startswith("aggregator-"):
                raise  # our update would be lost: the job cannot go on correctly
            self._lost(who, err)
            return
        self.sent[(op, who, step)] = (msg.sent_at_ns, 28 + 4 * msg.values.size)

    def _lost(self, who: str, err: base.TransportError) -> None:
        """ps-0 with a replica configured fails over; a lost replica is dropped; a lost
        aggregator only matters if we push again (at the end of a job it leaves on
        the PS's STOP, which may reach us after its connection closed)."""
        if who in ("ps-0", "replica-0") and "replica-0" in self.conns and "ps-0" in self.conns:
            self.conns.pop(who).close()
            if who == "ps-0":
                self.failed_over = {"time_ns": time.time_ns(), "error": str(err)}
            return
        if who.startswith("aggregator-") and who in self.conns:
            self.conns.pop(who).close()
            self.aggregator_gone = err
            return
        if self._stop_follows():
            self.conns.pop(who).close()
            return
        raise err

    def _stop_follows(self) -> bool:
        """True if a STOP arrives (or came) from any server within ps.STOP_WAIT_S. A
        shard told to stop by ps-0 closes at once, so our push or pull to it can fail
        before ps-0's STOP (or its own) is read: that is the end of the job, not a loss."""
        if self.stopped:
            return True
        if not hasattr(self, "inbox"):
            return False  # still connecting: nobody can have said STOP
        ev = self.inbox.stop_within(ps.STOP_WAIT_S)
        if ev is None:
            return False
        assert ev.msg is not None
        self.log.write(records.message_row(ev.msg, self.cfg.index))
        self.stopped = True
        return True

    def _train_step(self, step: int) -> bool:
        """Pull, compute and push iteration ``step``; False when a STOP came instead."""
        if self.layerwise:
            return self._layerwise_step(step)
        if not self._pull_all(step):
            return False
        for side in self.tor:   # what the ToR holds (the hot parameters)
            side.pulled(self.params, step)
        rows = next(self.batches)
        started = time.perf_counter()
        _, grad = self.model.loss_and_grad(self.params, self.x[rows], self.y[rows])
        self.compute_s.append(time.perf_counter() - started)
        sent = False   # the hot store's first: the PS's barrier then implies the ToR's
        for side in self.tor:
            sent = side.push(grad, step) or sent   # aggregation: to the ToR, not the PS
        if not sent:
            self._push_all(step, grad)
        return True

    def _layerwise_step(self, step: int) -> bool:
        """Forward each stage once its parameters are in; push each stage's gradient as
        soon as the backward pass has it."""
        self._begin_pull()
        stages: tuple[tuple[int, int], ...] = self._staged.stages
        last = len(stages) - 1
        waited = 0.0  # in ready/done: waiting for parameters, handing pushes over

        def ready(k: int) -> None:
            nonlocal waited
            lo, hi = stages[k]
            started = time.perf_counter()
            if not self._pull_until(step, lambda: bool(self.arrived[lo:hi].all())):
                raise _Stopped
            if k == 0 and self.missing:
                self.early_forwards += 1
            if k == last and not self._pull_until(step, lambda: not self.missing):
                raise _Stopped  # the whole messages (logs, FCT rows) are right behind
            waited += time.perf_counter() - started

        def done(k: int, grad: np.ndarray) -> None:
            nonlocal waited
            started = time.perf_counter()
            self._push_stage(step, k, grad)
            waited += time.perf_counter() - started

        rows = next(self.batches)
        try:
            started = time.perf_counter()
            layerwise.loss_and_grad(self.model, self.params, self.x[rows], self.y[rows],
                                    ready=ready, done=done)
            self.compute_s.append(time.perf_counter() - started - waited)
        except _Stopped:
            return False
        return True

    def _push_stage(self, step: int, k: int, grad: np.ndarray) -> None:
        """Send every shard the parts of its PUSH(step) that lie in stage ``k``."""
        slo, shi = self._staged.stages[k]
        for who in self._servers():
            shard = int(who.split("-")[1])
            lo, hi = self.ranges[shard]
            cuts = [c for c in self.push_cuts[shard] if slo <= lo + c.offset < shi]
            if not cuts:
                continue
            msg = Message(Kind.PUSH, step, self.cfg.index, grad[lo:hi])
            first = ("push", who, step) not in self.sent
            sent_ns = time.time_ns()
            try:
                conn: Any = self.conns[who]  # a TcpConnection: only tcp tags per tensor
                conn.send_cuts(msg, cuts, peers.left(self.deadline))
            except base.TransportError as err:
                self._lost(who, err)
                continue
            if first:
                self.sent[("push", who, step)] = (sent_ns, 28 + 4 * (hi - lo))

    def _begin_pull(self) -> None:
        self.missing = set(range(self.cfg.num_shards))
        self.arrived[:] = False

    def _pull_all(self, step: int) -> bool:
        """Wait for PARAMS(step) from every shard; False when a STOP came instead."""
        self._begin_pull()
        return self._pull_until(step, lambda: not self.missing)

    def _pull_until(self, step: int, enough: Callable[[], bool]) -> bool:
        """Take PARAMS(step) (whole, or parts of it) until ``enough()``; False on STOP."""
        missing = self.missing
        while not enough():
            if self.stopped:
                self._last_acks()
                return False
            try:
                ev = self.inbox.take(peers.left(self.deadline))
            except base.TransportTimeout as err:
                raise base.TransportTimeout(f"waiting for PARAMS({step}): {err}") from None
            who = self.names[ev.source]
            dequeued = time.time_ns()
            if ev.error is not None:
                if who not in self.conns:
                    continue  # already dropped after a failed send
                self._lost(who, ev.error)
                continue
            msg = ev.msg
            assert msg is not None
            if ev.partial:
                self._take_part(step, who, msg)
                continue
            if msg.kind in (Kind.PARAMS, Kind.STOP):
                self.log.write(records.message_row(msg, self.cfg.index))
            if msg.kind == Kind.STOP:
                self._last_acks()
                return False
            if msg.kind == Kind.ACK:
                self._client_row("push", who, msg, dequeued, time.time_ns())
                continue
            if msg.kind != Kind.PARAMS:
                raise PSGone(
                    f"{self._where(who)} sent {msg.kind.name}; a worker expects PARAMS or STOP"
                )
            if msg.iteration < step:
                continue  # a replica repeating a step we already have, after a take-over
            if msg.iteration > step:
                raise PSGone(f"{self._where(who)} sent PARAMS({msg.iteration}); expected {step}")
            shard = 0 if who == "replica-0" else int(who.split("-")[1])
            if shard not in missing:
                continue  # shard 0 from both primary and replica around the take-over
            lo, hi = self.ranges[shard]
            # a ToR kind's (multicast: the copies are in the socket, or lost), or ours
            if not any(side.take_params(step, self.params[lo:hi], msg, peers.left(self.deadline))
                       for side in self.tor):
                apply_params(self.params[lo:hi], msg)
            self.arrived[lo:hi] = True
            if self.flows_log is not None:
                for row in flows.rows(msg, self.name, self.model.layers, lo, hi,
                                      self.pull_levels):
                    self.flows_log.write(row)
            missing.discard(shard)
            self._client_row("pull", who, msg, dequeued, time.time_ns())
        return True

    def _take_part(self, step: int, who: str, msg: Message) -> None:
        """A part of PARAMS(step) is in: copy its tensor now, for the forward pass."""
        if msg.kind != Kind.PARAMS or msg.iteration != step or not who.startswith("ps-"):
            return  # anything wrong with it is reported when the whole message is taken
        shard = int(who.split("-")[1])
        if shard not in self.missing:
            return
        part = msg.parts[0]  # type: ignore[index]
        a = self.ranges[shard][0] + part.offset
        self.params[a:a + part.size] = msg.values[part.offset:part.offset + part.size]
        self.arrived[a:a + part.size] = True

    def _last_acks(self, wait_s: float = 1.0) -> None:
        """After STOP, log the ACKs of our last pushes: those already in (also from a
        shard dropped since, see _stop_follows) and those other shards still send."""
        deadline = time.monotonic() + wait_s
        while True:
            owed = any(op == "push" and who in self.conns for op, who, _ in self.sent)
            try:
                ev = self.inbox.take(peers.left(deadline) if owed else 0)
            except base.TransportTimeout:
                return
            if ev.msg is not None and ev.msg.kind == Kind.ACK:
                who = self.names[ev.source]
                self._client_row("push", who, ev.msg, time.time_ns(), time.time_ns())
            elif ev.error is not None or ev.msg is not None and ev.msg.kind == Kind.STOP:
                self.conns.pop(self.names[ev.source], None)

    def _push_all(self, step: int, grad: np.ndarray) -> None:
        if self.aggregator is not None:
            who = f"aggregator-{self.aggregator}"
            if who not in self.conns:
                raise self.aggregator_gone
            self._request(who, Message(Kind.PUSH, step, self.cfg.index, grad), "push", step)
            return
        for who in self._servers():
            shard = 0 if who == "replica-0" else int(who.split("-")[1])
            lo, hi = self.ranges[shard]
            msg = Message(Kind.PUSH, step, self.cfg.index, grad[lo:hi])
            self._request(who, msg, "push", step)

    def _client_row(self, op: str, who: str, msg: Message, dequeued: int, done: int) -> None:
        sent_ns, request_bytes = self.sent.pop((op, who, msg.iteration), (0, 0))
        self.rpcs.write({
            "op": op, "client": self.name, "server": who, "step": msg.iteration,
            "sent_ns": sent_ns, "request_bytes": request_bytes,
            "reply_arrived_ns": msg.received_at_ns, "dequeued_ns": dequeued, "done_ns": done,
            "reply_bytes": msg.wire_bytes,
        })
