"""Aggregator role (MLfabric's intermediate hop): sum a group's updates, forward one push.

Workers of the group push their whole gradient here instead of to the shards; the
aggregator ACKs each, and once it holds PUSH(k) from every member it sends each
shard (and the PS replica) one PUSH(k) with the sum of its range. The PS weighs
that push by the group's size, so the average is the same as without the
aggregator, while the PS's link and queue see one update per group instead of one
per worker. With a lossy transport the forwarded mask is the union of the
members' masks (a coordinate some members lost is averaged as if all sent it: an
approximation, exact over TCP). Models are still pulled from the shards directly.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from tailcut import errors, transports
from tailcut.ml import models
from tailcut.training import inbox, peers, ps, records, syncmodes
from tailcut.training import shards
from tailcut.training.config import RoleConfig, split_endpoint
from tailcut.transports import base
from tailcut.transports.base import Kind, Message

# Members, and shards other than ps-0, close their connections as soon as they are
# told STOP, possibly before ps-0's STOP reaches us: wait this long for it before
# calling such a close a failure (as a PS shard does for its workers).
STOP_WAIT_S = ps.STOP_WAIT_S


def run(cfg: RoleConfig, emit: Any = None) -> dict[str, Any]:
    """Aggregate until the PS says STOP; return a summary."""
    return _Aggregator(cfg).run()


class _Aggregator:
    def __init__(self, cfg: RoleConfig) -> None:
        self.cfg = cfg
        self.name = f"aggregator-{cfg.index}"
        self.group = list(cfg.aggregators[cfg.index]["workers"])
        self.deadline = time.monotonic() + cfg.timeout_s + ps.FOLLOWER_GRACE_S
        model = models.create(cfg.model, models.dataset(cfg.model, cfg.seed))
        self.num_params = model.num_params
        self.ranges = [
            shards.shard_range(model.num_params, cfg.num_shards, s) for s in range(cfg.num_shards)
        ]
        self.sent: dict[tuple[str, int], tuple[int, int]] = {}

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        options = {k: v for k, v in cfg.transport.items() if k != "type"}
        transport = transports.get(cfg.transport["type"], **options)
        conns: dict[str, base.Connection] = {}
        rounds = 0
        results = Path(cfg.results_dir)
        try:
            with (
                records.CsvLog(results / records.rpc_filename("server", self.name),
                               records.SERVER_RPC_FIELDS) as self.server_log,
                records.CsvLog(results / records.rpc_filename("client", self.name),
                               records.CLIENT_RPC_FIELDS) as self.client_log,
            ):
                # Listen for the group first, then connect to the shards: a datagram
                # transport's connections share the socket listen opens.
                host, port = split_endpoint(cfg.aggregators[cfg.index]["endpoint"])
                accepted = peers.listen(transport, host, port, len(self.group), self.deadline)
                ups = [(f"ps-{s}", h, p) for s, (h, p) in enumerate(cfg.shards)]
                if cfg.replica is not None:
                    ups.append(("replica-0", *cfg.replica))
                for who, host, port in ups:
                    conns[who] = peers.hello(transport, host, port, peers.AGGREGATOR, cfg.index,
                                             self.deadline)
                    conns[who].peer = f"{who} at {host}:{port}"
                members = peers.accept(transport, accepted, {f"worker-{w}" for w in self.group},
                                       self.deadline)
                conns.update(members)
                self.conns = conns
                self.names = list(conns)
                self.inbox = inbox.Inbox(list(conns.values()), cfg.ordering)
                while self._round(rounds):
                    rounds += 1
        finally:
            for conn in conns.values():
                conn.close()
            transport.close()
        return {"event": "aggregator_done", "index": self.cfg.index, "rounds": rounds}

    def _round(self, k: int) -> bool:
        """Sum PUSH(k) of every member and forward it; False once the PS said STOP."""
        total = np.zeros(self.num_params, dtype=np.float32)
        delivered = np.zeros(self.num_params, dtype=bool)
        got: set[str] = set()
        stop_by: float | None = None
        peer_gone: base.TransportError | None = None
        while len(got) < len(self.group):
            try:
                timeout = peers.left(self.deadline if stop_by is None else stop_by)
                ev = self.inbox.take(timeout)
            except base.TransportTimeout as err:
                if peer_gone is not None:  # no STOP followed: the peer really failed
                    raise errors.RunError(f"{self.name}: round {k}: {peer_gone}") from peer_gone
                raise errors.RunError(f"{self.name}: round {k}: nothing arrived in time") from err
            who = self.names[ev.source]
            dequeued = time.time_ns()
            if ev.error is not None:
                if self._lost(k, who, ev.error) and peer_gone is None:
                    # probably the end of the job: wait for STOP
                    peer_gone = ev.error
                    stop_by = time.monotonic() + STOP_WAIT_S
                continue
            msg = ev.msg
            assert msg is not None
            if msg.kind == Kind.STOP:
                return False
            if msg.kind == Kind.ACK:
                self._log_ack(who, msg, dequeued)
                continue
            self._check_push(k, who, msg, got)
            syncmodes.accumulate(total, np.zeros(self.num_params, np.float32), msg, self.num_params, 1)
            delivered |= True if msg.mask is None else msg.mask
            got.add(who)
            self._ack_push(k, who, msg, ev.arrived_ns, dequeued)
        return self._forward(k, total, delivered)

    def _lost(self, k: int, who: str, error: base.TransportError) -> bool:
        """Drop a connection that failed if the round can do without it; True when its
        failure may only be the job ending (a member, or a shard other than ps-0)."""
        if who not in self.conns:
            return False  # already dropped after a failed send (its reader reports too)
        if who == "ps-0" and "replica-0" in self.conns:
            self.conns.pop(who).close()  # the replica takes over
            return False
        if who == "replica-0":
            self.conns.pop(who, None)
            return False
        if who.startswith("worker-") or who.startswith("ps-") and who != "ps-0":
            return True
        raise errors.RunError(f"{self.name}: round {k}: {error}") from error

    def _log_ack(self, who: str, msg: Message, dequeued: int) -> None:
        """Log a shard's ACK of a push we forwarded, with when we had sent it."""
        sent_ns, size = self.sent.pop((who, msg.iteration), (0, 0))
        self.client_log.write({
            "op": "push", "client": self.name, "server": who, "step": msg.iteration,
            "sent_ns": sent_ns, "request_bytes": size,
            "reply_arrived_ns": msg.received_at_ns, "dequeued_ns": dequeued,
            "done_ns": time.time_ns(), "reply_bytes": msg.wire_bytes,
        })

    def _check_push(self, k: int, who: str, msg: Message, got: set[str]) -> None:
        """Fail on anything but a member's first PUSH of round k."""
        if msg.kind != Kind.PUSH or msg.iteration != k or who in got:
            raise errors.RunError(
                f"{self.name}: expected PUSH for round {k} from its workers, got "
                f"{msg.kind.name}({msg.iteration}) from {who}"
            )

    def _ack_push(self, k: int, who: str, msg: Message, arrived_ns: int,
                  dequeued: int) -> None:
        """ACK a member's PUSH of round k, and log it as its server."""
        replied = time.time_ns()
        self.conns[who].send(Message(Kind.ACK, k, self.cfg.index), peers.left(self.deadline))
        self.server_log.write({
            "op": "push", "client": who, "server": self.name, "step": k, "version": k,
            "arrived_ns": arrived_ns, "dequeued_ns": dequeued, "ready_ns": dequeued,
            "replied_ns": replied, "request_bytes": msg.wire_bytes, "reply_bytes": 28,
            "nonzero": int(np.count_nonzero(msg.values)),
        })

    def _forward(self, k: int, total: np.ndarray, delivered: np.ndarray) -> bool:
        """Send each shard (and the replica) its range of the round's sum; False when a
        shard had been told STOP before us."""
        mask = None if delivered.all() else delivered
        for who in [w for w in self.conns if w.startswith(("ps-", "replica-"))]:
            shard = 0 if who == "replica-0" else int(who.split("-")[1])
            lo, hi = self.ranges[shard]
            out = Message(Kind.PUSH, k, self.cfg.index, total[lo:hi],
                          None if mask is None else mask[lo:hi], sent_at_ns=time.time_ns())
            try:
                self.conns[who].send(out, peers.left(self.deadline))
            except base.TransportError as err:
                if who in ("ps-0", "replica-0") and "replica-0" in self.conns:
                    self.conns.pop(who).close()
                    continue
                if who != "ps-0" and self.inbox.stop_within(STOP_WAIT_S) is not None:
                    return False  # that shard had been told STOP before us
                raise errors.RunError(f"{self.name}: round {k}: {err}") from err
            self.sent[(who, k)] = (out.sent_at_ns, 28 + 4 * (hi - lo))
        return True
