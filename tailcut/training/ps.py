"""Parameter server role (one shard, or the PS replica): where a gradient is averaged.

Each shard owns one contiguous range of the flat parameter vector (``shard_range``:
equal element counts, because one layer dominates most models, the MLP's first
layer holds 98% of its weights, so cutting by layer would leave shards idle).
Workers talk to it in RPCs (tailcut.training.inbox has the receiving queue):

- pull: a worker's HELLO (step 0) or PULL(k) asks for the model for its step k;
  the PS answers PARAMS(k) with its range once the sync mode allows it
  (tailcut.training.syncmodes):
  ``bsp`` when iteration k-1's barrier has passed, ``ssp`` when the worker is at
  most ``staleness`` steps ahead of the slowest, ``async`` at once;
- push: PUSH(k) carries the update for this range (from a worker, or a group's sum
  from an aggregator); the PS answers ACK(k). ``bsp`` sums the pushes of iteration
  k and steps on their combination at the barrier (tailcut.training.aggregation; by
  default the average over the workers that delivered each coordinate);
  ``async``/``ssp`` apply each push at once with ``learning_rate / num_workers`` so a
  round of N pushes moves as far as one bsp step.

Shard 0 evaluates: at every epoch boundary the other shards send it their range,
it evaluates the whole model and tells them to continue or STOP. The replica (role
``replica``, one shard only) receives every push and pull the primary receives and
runs the same arithmetic without answering; when its connection to the primary
breaks before a STOP it takes over: re-sends each worker the model for the step it
last asked for, and from then on answers, evaluates and logs like the primary.

Progress goes to ``emit`` as events (role.py prints them as JSON lines)::

    {"event": "start", "num_params": 64714, "iterations_per_epoch": 63, ...}
    {"event": "epoch", "epoch": 1, "iteration": 63, "train_loss": ..., ...}
    {"event": "takeover", "iteration": 40, "at_s": 3.2, ...}     (replica only)
    {"event": "done", "converged": true, "stop_reason": "target_accuracy", ...}
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tailcut import errors, transports
from tailcut.ml import models
from tailcut.training import (aggregation, cpustats, flows, inbox, peers, records, rpc,
                              syncmodes, torkinds)
from tailcut.training.config import RoleConfig
from tailcut.training.shards import shard_range
from tailcut.transports import base
from tailcut.transports.base import Kind, Message

Emit = Callable[[dict[str, Any]], None]

# The PS reports training loss on a fixed slice of the training set rather than on
# every example: evaluating 8000 rows per epoch would stall all workers longer.
TRAIN_EVAL_ROWS = 2000
# Shards > 0 and the replica follow shard 0's / the primary's STOP; they wait this
# much longer than timeout_s so that they never stop first.
FOLLOWER_GRACE_S = 30.0
# A follower that loses a worker waits this long for ps-0's STOP before failing.
STOP_WAIT_S = 5.0


def iterations_per_epoch(num_train: int, batch_size: int, num_workers: int) -> int:
    """Iterations for the workers together to see ``num_train`` examples once."""
    return max(math.ceil(num_train / (batch_size * num_workers)), 1)


def run(cfg: RoleConfig, emit: Emit) -> dict[str, Any]:
    """Run a PS shard or the replica to the end of the job; return the "done" event."""
    return _Server(cfg, emit).run()


class _Server:
    """The state of one PS shard (or the replica) during a job."""

    def __init__(self, cfg: RoleConfig, emit: Emit) -> None:
        self.cfg = cfg
        self.emit = emit
        self.is_replica = cfg.role == "replica"
        self.shard = 0 if self.is_replica else cfg.index
        self.name = "replica-0" if self.is_replica else f"ps-{self.shard}"
        self.active = not self.is_replica  # a replica answers nobody until it takes over
        self.evaluates = self.shard == 0 and self.active
        self.follower = self.is_replica or self.shard > 0
        self.started = time.monotonic()
        grace = FOLLOWER_GRACE_S if self.follower else 0.0
        self.deadline = self.started + cfg.timeout_s + grace
        self.dataset = models.dataset(cfg.model, cfg.seed)
        self.model = models.create(cfg.model, self.dataset)
        self.lo, self.hi = shard_range(self.model.num_params, cfg.num_shards, self.shard)
        self.size = self.hi - self.lo
        full = self.model.init_params(np.random.default_rng(cfg.seed))
        self.full = full  # shard 0 assembles the whole model here to evaluate it
        self.params = full[self.lo : self.hi].copy()
        # The ToR kinds the job asks for (spec.network.inNetwork): what the ToRs hold,
        # sum or copy changes what the PS reads, steps on and answers (training.torkinds).
        self.tor = torkinds.ps_sides(torkinds.PSContext(
            cfg, self.model, self.dataset, self.size, active=self.active,
            evaluates=self.evaluates))
        self.tor_summaries: dict[str, Any] = {}
        self.per_epoch = iterations_per_epoch(
            len(self.dataset.x_train), cfg.batch_size, cfg.num_workers
        )
        self.results = Path(cfg.results_dir)
        self.iteration = self.epoch = self.version = 0
        self.stop_reason = ""
        self.last_eval: tuple[float, float] | None = None
        self.takeover: dict[str, Any] | None = None
        # push sources: direct workers (weight 1), aggregators (their group's size)
        self.weight = {f"worker-{w}": 1 for w in cfg.direct_workers()}
        for a, agg in enumerate(cfg.aggregators):
            self.weight[f"aggregator-{a}"] = len(agg["workers"])
        self.sync = syncmodes.create(cfg, self.size, self.weight)
        self.early: list[inbox.Event] = []  # replica: pushes for a later bsp iteration
        self.held: list[tuple[inbox.Event, int]] = []  # pulls waiting for the sync mode
        self.last_pull: dict[str, int] = {}  # worker -> step it last asked for
        self.updates = np.zeros(self.size, dtype=np.int64)  # per-parameter update counts
        self.arrivals: list[tuple[int, str]] = []  # (arrived_ns, client) of every request
        self.early_ranges: list[inbox.Event] = []  # shard 0: ranges for an epoch end ahead
        try:  # CadentFlow levels (None: fair, messages go whole and untagged)
            self.pull_levels = flows.levels_for(cfg.flows, "pull", self.model.layers)
            self.push_levels = flows.levels_for(cfg.flows, "push", self.model.layers)
        except ValueError as err:
            raise errors.RunError(str(err)) from None

    # ----------------------------------------------------------------- set-up
    def _expected_peers(self) -> set[str]:
        cfg = self.cfg
        names = {f"worker-{w}" for w in range(cfg.num_workers)}
        names |= {f"aggregator-{a}" for a in range(len(cfg.aggregators))}
        if self.shard == 0 and not self.is_replica:
            names |= {f"ps-{s}" for s in range(1, cfg.num_shards)}
            if cfg.replica is not None:
                names.add("replica-0")
        return names

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        options = {k: v for k, v in cfg.transport.items() if k != "type"}
        transport = transports.get(cfg.transport["type"], **options)
        conns: list[base.Connection] = []
        logs: list[records.CsvLog] = []
        try:
            host, port = cfg.replica if self.is_replica else cfg.shards[self.shard]  # type: ignore[misc]
            expected = self._expected_peers()
            # Listen first, then connect to shard 0 / the primary: a datagram transport's
            # connections share the socket listen opens on our own endpoint. Shard 0
            # waits for us meanwhile; our workers reach us as they come.
            accepted = peers.listen(transport, host, port, len(expected), self.deadline)
            conns.extend(accepted)
            upstream: base.Connection | None = None
            if self.is_replica:
                host, port = cfg.shards[0]
                upstream = peers.hello(transport, host, port, peers.REPLICA, 0, self.deadline)
                upstream.peer = f"the primary PS ({host}:{port})"
                conns.append(upstream)
            elif self.shard > 0:
                host, port = cfg.shards[0]
                upstream = peers.hello(transport, host, port, peers.SHARD, self.shard, self.deadline)
                upstream.peer = f"ps 0 ({host}:{port})"
                conns.append(upstream)
            role, index = self.name.rsplit("-", 1)
            self.messages = records.CsvLog(
                self.results / records.messages_filename(role, int(index)),
                records.MESSAGE_FIELDS,
            )
            logs.append(self.messages)
            by_name = peers.accept(transport, accepted, expected, self.deadline)
            if upstream is not None:
                by_name["ps-0" if self.shard > 0 else "primary"] = upstream
            self.names = list(by_name)
            self.conns = by_name
            self.flows_log: records.CsvLog | None = None
            if cfg.flows is not None:
                self.flows_log = records.CsvLog(self.results / flows.filename(self.name),
                                                flows.FIELDS)
                logs.append(self.flows_log)
            if self.pull_levels is not None:
                pull_cuts = flows.cuts(self.model.layers, self.lo, self.hi, self.pull_levels)
                for who, conn in by_name.items():
                    if who.startswith("worker-"):
                        flows.tag(conn, Kind.PARAMS, pull_cuts)
            for who, conn in by_name.items():  # coflow: each pull paced at its MADD rate
                flows.pace(conn, cfg.flows, self.name, who, Kind.PARAMS, self.model.layers,
                           self.lo, self.hi)
            self.rpcs = records.CsvLog(
                self.results / records.rpc_filename("server", self.name),
                records.SERVER_RPC_FIELDS,
            )
            logs.append(self.rpcs)
            self.epochs_log: records.CsvLog | None = None
            if self.evaluates:
                self.epochs_log = records.CsvLog(self.results / "epochs.csv", records.EPOCH_FIELDS)
                logs.append(self.epochs_log)
            self.logs = logs
            for who, conn in by_name.items():
                if who.startswith("worker-"):
                    self.messages.write(records.message_row(conn.hello, base.PS_SENDER))  # type: ignore[attr-defined]
            self.emit(
                {
                    "event": "start",
                    "job": cfg.job,
                    "role": self.name,
                    "model": cfg.model,
                    "num_params": self.model.num_params,
                    "shard_range": [self.lo, self.hi],
                    "num_workers": cfg.num_workers,
                    "iterations_per_epoch": self.per_epoch,
                    "sync_mode": cfg.sync_mode,
                    "transport": cfg.transport["type"],
                    "setup_s": round(time.monotonic() - self.started, 3),
                }
            )
            self.inbox = inbox.Inbox(list(by_name.values()), cfg.ordering)
            self.train_start = time.monotonic()
            # A worker's HELLO is its pull for step 0.
            for who, conn in by_name.items():
                if who.startswith("worker-"):
                    hello = conn.hello  # type: ignore[attr-defined]
                    ev = inbox.Event(-1, Message(Kind.PULL, 0, hello.sender), None,
                                     hello.received_at_ns)
                    ev.msg.wire_bytes = hello.wire_bytes  # type: ignore[union-attr]
                    self._pull(ev, who)
            self._loop()
            self._finish()
        finally:
            cpustats.checkpoint()  # the transport's threads end with it
            for conn in conns:
                conn.close()
            transport.close()
            for log in logs:
                log.close()
            for side in self.tor:
                side.close()
        return self._done()

    # ------------------------------------------------------------- main loop
    def _loop(self) -> None:
        while not self.stop_reason:
            try:
                ev = self.inbox.take(peers.left(self.deadline))
            except base.TransportTimeout:
                self.stop_reason = "timeout"
                break
            who = self.names[ev.source]
            if ev.error is not None:
                self._lost(who, ev.error)
                continue
            msg = ev.msg
            assert msg is not None
            if msg.kind == Kind.PARAMS and who.startswith("ps-") and not self.follower:
                # Another shard's range for an epoch end we have not reached: its barrier
                # passed first (a layer-wise worker pushes the later layers, which the
                # later shards hold, before the first ones). _assemble takes it.
                self.early_ranges.append(ev)
            elif msg.kind == Kind.PUSH:
                self._push(ev, who)
            elif msg.kind == Kind.PULL:
                self._pull(ev, who)
            elif msg.kind == Kind.STOP and who in ("ps-0", "primary"):
                self.stop_reason = "stopped_by_ps_0" if who == "ps-0" else "primary_finished"
            else:
                raise errors.RunError(
                    f"{self.conns[who].peer} sent {msg.kind.name} for iteration "
                    f"{msg.iteration}; a {self.name} expects PUSH or PULL"
                )

    def _lost(self, who: str, err: base.TransportError) -> None:
        """A connection failed: the primary (replica takes over), or a fatal peer."""
        if self.stop_reason:
            return
        if who == "primary" and not self.active:
            self._take_over()
            return
        if who == "replica-0":
            self.emit({"event": "replica_lost", "iteration": self.iteration, "error": str(err)})
            del self.conns[who]
            return
        upstream = "ps-0" if self.shard > 0 else "primary"
        if self.follower and upstream in self.conns and not who.startswith("ps-"):
            # Workers leave as soon as ps-0 says STOP, maybe before its STOP reaches us.
            try:
                ev = self.inbox.take(STOP_WAIT_S, match=lambda e: self.names[e.source] == upstream)
            except base.TransportTimeout:
                ev = None
            if ev is not None and ev.msg is not None and ev.msg.kind == Kind.STOP:
                self.stop_reason = "stopped_by_ps_0" if self.shard > 0 else "primary_finished"
                return
            if ev is not None and ev.error is not None and not self.active:
                self._take_over()  # the primary died too: the replica goes on
                return
        raise errors.RunError(f"iteration {self.iteration}: {err}") from err

    def _push(self, ev: inbox.Event, who: str) -> None:
        msg = ev.msg
        assert msg is not None
        dequeued = time.time_ns()
        if who not in self.weight:
            raise errors.RunError(
                f"{self.conns[who].peer} pushed an update but pushes through an aggregator"
            )
        if msg.values.shape != (self.size,):
            raise errors.RunError(
                f"{who} pushed {msg.values.size} values; {self.name} holds {self.size}"
            )
        if self.is_replica and self.sync.ahead(msg, self.iteration):
            # The primary's barrier can pass, and a fast worker push the next
            # iteration, before a slow worker's push of this one reaches us.
            self.early.append(ev)
            return
        changed = self._count(ev, who)
        before = self.iteration
        self.iteration, self.version = self.sync.apply(who, msg, self.params, self.iteration,
                                                       self.version)
        progressed = self.iteration != before
        replied = time.time_ns()
        reply_bytes = self._send(who, Message(Kind.ACK, msg.iteration, base.PS_SENDER))
        self._row("push", who, msg.iteration, ev.arrived_ns, dequeued, dequeued, replied,
                  msg.wire_bytes, reply_bytes, int(np.count_nonzero(changed)))
        if progressed:
            self._progress()
        if not self.stop_reason:
            self._release()
        if progressed and self.early:
            early, self.early = self.early, []
            for e in sorted(early, key=lambda e: e.seq):
                self._push(e, self.names[e.source])

    def _count(self, ev: inbox.Event, who: str) -> np.ndarray:
        """Log a push being applied; count it per parameter (coordinates it changed)."""
        msg = ev.msg
        assert msg is not None
        self.arrivals.append((ev.arrived_ns, who))
        self.messages.write(records.message_row(msg, base.PS_SENDER))
        if self.flows_log is not None:
            for row in flows.rows(msg, self.name, self.model.layers, self.lo, self.hi,
                                  self.push_levels):
                self.flows_log.write(row)
        changed: np.ndarray = msg.values != 0
        if msg.mask is not None:
            changed &= msg.mask
        self.updates += changed
        return changed

    def _pull(self, ev: inbox.Event, who: str) -> None:
        msg = ev.msg
        assert msg is not None
        dequeued = time.time_ns()
        if not who.startswith("worker-"):
            raise errors.RunError(f"{self.conns[who].peer} sent PULL; only workers pull")
        self.arrivals.append((ev.arrived_ns, who))
        self.last_pull[who] = msg.iteration
        if self._allowed(who, msg.iteration):
            self._answer(ev, who, dequeued, dequeued)
        else:
            self.held.append((ev, dequeued))
        current = self.iteration
        for side in self.tor:
            if side.pulled(who, msg.iteration, current):
                self._step_on_sums(side)

    def _step_on_sums(self, side: torkinds.PSSide) -> None:
        """Every worker has sent its gradient of this iteration to the ToRs (in-network
        aggregation): step on their sums (the bsp barrier)."""
        # divided in float64 (the sums are), the step float32 like the parameters; an
        # element nobody's value reached stays as it was
        total, counts = side.sums(self.iteration, peers.left(self.deadline))
        step, delivered = aggregation.combine(total, counts, self.cfg.aggregation)
        self.params -= np.float32(self.cfg.learning_rate) * step
        self.updates += delivered & (step != 0)
        self.iteration += 1
        self.version = self.iteration
        self._progress()
        if not self.stop_reason:
            self._release()

    def _allowed(self, who: str, step: int) -> bool:
        return self.sync.allowed(who, step, self.iteration)

    def _release(self) -> None:
        """Answer the held pulls the sync mode now allows, in the ordering's order."""
        waiting = sorted(self.held, key=lambda h: h[0].sort_key(self.cfg.ordering))
        self.held = []
        for ev, dequeued in waiting:
            who = self.names[ev.source] if ev.source >= 0 else f"worker-{ev.msg.sender}"  # type: ignore[union-attr]
            if self._allowed(who, ev.msg.iteration):  # type: ignore[union-attr]
                self._answer(ev, who, dequeued, time.time_ns())
            else:
                self.held.append((ev, dequeued))

    def _answer(self, ev: inbox.Event, who: str, dequeued: int, ready: int) -> None:
        msg = ev.msg
        assert msg is not None
        values = self._reply_values(msg.iteration)
        replied = time.time_ns()
        reply_bytes = self._send(who, Message(Kind.PARAMS, msg.iteration, base.PS_SENDER, values))
        self._row("pull", who, msg.iteration, ev.arrived_ns, dequeued, ready, replied,
                  msg.wire_bytes, reply_bytes, 0)

    def _reply_values(self, iteration: int) -> np.ndarray:
        """The values of a PARAMS: a ToR kind's (multicast: none, the racks got a copy),
        else a copy of ours (preparing the reply: what PS_proc of a pull measures)."""
        for side in self.tor:
            values = side.reply(iteration, self.params)
            if values is not None:
                return values
        return self.params.copy()

    def _send(self, who: str, msg: Message) -> int:
        """Send unless passive; return the frame's size (header + values) for the logs."""
        size = 28 + 4 * msg.values.size
        if not self.active or who not in self.conns:
            return size
        if self.stop_reason:
            return size  # told to stop mid-way (a follower): the rest is moot
        try:
            self.conns[who].send(msg, peers.left(self.deadline))
        except base.TransportError as err:
            self._lost(who, err)  # a follower may find ps-0 has said STOP meanwhile
        return size

    def _row(self, op: str, who: str, step: int, arrived: int, dequeued: int, ready: int,
             replied: int, request_bytes: int, reply_bytes: int, nonzero: int) -> None:
        if not self.active:
            return  # a passive replica's replies go nowhere: nothing to dissect
        self.rpcs.write({
            "op": op, "client": who, "server": self.name, "step": step,
            "version": self.version, "arrived_ns": arrived, "dequeued_ns": dequeued,
            "ready_ns": ready, "replied_ns": replied, "request_bytes": request_bytes,
            "reply_bytes": reply_bytes, "nonzero": nonzero,
        })

    # ------------------------------------------------------ epochs and stopping
    def _progress(self) -> None:
        """After an iteration (bsp barrier, or N async pushes): epoch end, limits."""
        cfg = self.cfg
        if self.iteration % self.per_epoch == 0:
            self.epoch += 1
            self._end_of_epoch()
        if self.stop_reason or self.follower:
            return  # shards > 0 and a passive replica stop when they are told to
        if cfg.max_iterations is not None and self.iteration >= cfg.max_iterations:
            self.stop_reason = "max_iterations"
        elif time.monotonic() >= self.deadline:
            self.stop_reason = "timeout"

    def _end_of_epoch(self) -> None:
        self.last_eval = None
        if self.shard > 0:  # hand our range to shard 0 and wait for its verdict
            self._send_up(Message(Kind.PARAMS, self.iteration, self.shard, self.params))
            ev = self._take_from("ps-0")
            if ev.msg is not None and ev.msg.kind == Kind.STOP:
                self.stop_reason = "stopped_by_ps_0"
            return
        if not self.active:
            return  # the passive replica only keeps count
        self._assemble()
        cfg = self.cfg
        x_fit = self.dataset.x_train[:TRAIN_EVAL_ROWS]
        y_fit = self.dataset.y_train[:TRAIN_EVAL_ROWS]
        train_loss, _ = self.model.evaluate(self.full, x_fit, y_fit)
        self.last_eval = self.model.evaluate(self.full, self.dataset.x_test, self.dataset.y_test)
        row = {
            "epoch": self.epoch,
            "iteration": self.iteration,
            "train_loss": round(train_loss, 6),
            "test_loss": round(self.last_eval[0], 6),
            "test_accuracy": round(self.last_eval[1], 6),
            "elapsed_s": round(time.monotonic() - self.train_start, 3),
        }
        assert self.epochs_log is not None
        self.epochs_log.write(row)
        self.epochs_log.flush()
        self.messages.flush()
        self.rpcs.flush()
        self.emit({"event": "epoch", **row})
        if cfg.target_accuracy is not None and self.last_eval[1] >= cfg.target_accuracy:
            self.stop_reason = "target_accuracy"
        elif self.epoch >= cfg.max_epochs:
            self.stop_reason = "max_epochs"
        elif time.monotonic() >= self.deadline:
            self.stop_reason = "timeout"
        verdict = Kind.STOP if self.stop_reason else Kind.PARAMS
        for s in range(1, cfg.num_shards):
            self._send_to(f"ps-{s}", Message(verdict, self.iteration, base.PS_SENDER))

    def _assemble(self) -> None:
        """Put every shard's range into ``self.full`` (shard 0: ask the others' at an end)."""
        self.full[self.lo : self.hi] = self.params
        for side in self.tor:   # what the ToR holds (the hot parameters)
            side.fill_model(self.full, self.iteration)
        for s in range(1, self.cfg.num_shards):
            ev = self._take_from(f"ps-{s}")
            msg = ev.msg
            assert msg is not None
            if msg.kind != Kind.PARAMS:
                raise errors.RunError(f"ps-{s} sent {msg.kind.name}; expected its range")
            lo, hi = shard_range(self.model.num_params, self.cfg.num_shards, s)
            self.full[lo:hi] = msg.values

    def _take_from(self, who: str) -> inbox.Event:
        """Wait for the next message from ``who``; others stay queued for the loop."""
        index = self.names.index(who)
        for ev in self.early_ranges:
            if ev.source == index:
                self.early_ranges.remove(ev)
                return ev
        try:
            ev = self.inbox.take(peers.left(self.deadline), match=lambda e: e.source == index)
        except base.TransportTimeout as err:
            raise errors.RunError(f"{who} sent nothing in time at iteration {self.iteration}") from err
        if ev.error is not None:
            raise errors.RunError(f"iteration {self.iteration}: {ev.error}") from ev.error
        return ev

    def _send_up(self, msg: Message) -> None:
        self._send_to("ps-0", msg)

    def _send_to(self, who: str, msg: Message) -> None:
        try:
            self.conns[who].send(msg, peers.left(self.deadline))
        except base.TransportError as err:
            raise errors.RunError(f"iteration {self.iteration}: {err}") from err

    def _take_over(self) -> None:
        """The primary is gone: answer from now on, starting with every worker's last pull."""
        self.active = True
        self.evaluates = True
        self.follower = False
        self.deadline = self.started + self.cfg.timeout_s
        self.takeover = {
            "iteration": self.iteration,
            "version": self.version,
            "at_s": round(time.monotonic() - self.train_start, 3),
            "time_ns": time.time_ns(),
        }
        self.emit({"event": "takeover", **self.takeover})
        (self.results / "takeover.json").write_text(json.dumps(self.takeover, indent=2) + "\n")
        self.epochs_log = records.CsvLog(
            self.results / "epochs.csv", records.EPOCH_FIELDS, append=True
        )
        self.logs.append(self.epochs_log)
        del self.conns["primary"]
        # A worker that already had this step's model drops the repeat (its step moved on).
        for who, step in sorted(self.last_pull.items()):
            if self._allowed(who, step) and not any(
                self.names[e.source] == who for e, _ in self.held if e.source >= 0
            ):
                self._send(who, Message(Kind.PARAMS, step, base.PS_SENDER, self.params.copy()))
        self._release()

    def _finish(self) -> None:
        """Tell everyone the job is over; shard 0 makes sure it has the final model."""
        if self.shard > 0:
            if self.stop_reason == "stopped_by_ps_0":  # shard 0 may need our final range
                try:
                    self._send_up(Message(Kind.PARAMS, self.iteration, self.shard, self.params))
                except errors.RunError:
                    pass  # shard 0 had evaluated already and left
        if self.active:
            # Peers (shards, replica, aggregators) first: workers leave at once on STOP.
            for who, conn in sorted(self.conns.items(), key=lambda i: i[0].startswith("worker-")):
                if who in ("ps-0", "primary") or self.shard > 0 and not who.startswith("worker-"):
                    continue
                try:
                    conn.send(Message(Kind.STOP, self.iteration, base.PS_SENDER), timeout_s=5.0)
                except base.TransportError:
                    pass  # after a timeout or a stop some peers are gone already
        self.jct_s = time.monotonic() - self.train_start
        if self.evaluates and self.last_eval is None:
            if self.cfg.num_shards > 1 or any(side.holds_parameters for side in self.tor):
                self._assemble()
            else:
                self.full[self.lo : self.hi] = self.params
            self.last_eval = self.model.evaluate(self.full, self.dataset.x_test, self.dataset.y_test)
        np.savez(self.results / f"updates-{self.name}.npz", counts=self.updates, lo=self.lo,
                 hi=self.hi)
        for side in self.tor:
            summary = side.finish(self.results)
            if summary is not None:
                self.tor_summaries[side.key] = summary
        rpc.write_connections(
            self.results / f"connections-{self.name}.csv", self.arrivals, self.cfg.window_us
        )

    def _done(self) -> dict[str, Any]:
        final_loss, final_accuracy = self.last_eval or (float("nan"), float("nan"))
        target = self.cfg.target_accuracy
        done = {
            "event": "done",
            "role": self.name,
            "converged": bool(target is not None and self.last_eval is not None
                              and final_accuracy >= target),
            "stop_reason": self.stop_reason,
            "epochs": self.epoch,
            "iterations": self.iteration,
            "updates": self.version,
            "jct_s": round(self.jct_s, 3),
            "final_accuracy": round(final_accuracy, 6) if self.last_eval else None,
            "final_loss": round(final_loss, 6) if self.last_eval else None,
        }
        if self.takeover is not None:
            done["takeover"] = self.takeover
        done.update(self.tor_summaries)
        self.emit(done)
        return done
