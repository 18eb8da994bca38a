"""A role of bench/bl_message_cost.py, run in a pod: `python bench/bl_cost_role.py CONFIG`.

pong: accept one connection; answer every PUSH with a PARAMS of the same size, until
      STOP. ping: connect; `rounds` times send a PUSH of `elements` float32s and wait
      for the PARAMS (a worker's PUSH, then its PULL's reply, back to back).

Each side prints one JSON line: per message it received, when it was sent, queued
and handed to the application (time.time_ns(), one host clock for every pod). With
`trace` set (datagram transports), both sides also stamp each message's phases with
time.monotonic_ns(), which is also bpf_ktime_get_ns()'s clock, by wrapping a few
methods of the transport (nothing in tailcut is changed for this): send called,
BEGIN written, sender thread started, first pass sent, DONE read (sender); BEGIN
read, first packet taken, XDP event, queued for the app, recv returned (receiver).
The bench joins the two sides by (kind, message id). Tracing is for this tree's
layout of the transport; an older tree's methods may differ (then no phases)."""

import collections
import json
import os
import resource
import sys
import threading
import time
from typing import Any

import numpy as np

from tailcut import transports
from tailcut.transports.base import Kind, Message

WARMUP = 10  # rounds before the CPU time and context switches are counted
Stamps = dict[tuple[int, int], dict[str, int]]


def trace(stamps: Stamps, reads: list[tuple[int, int]]) -> None:
    """Wrap the datagram transport's methods to stamp each message's phases."""
    from tailcut.transports import batch, datagram, receiver
    from tailcut.transports.control import FrameType

    def now() -> int:
        return time.monotonic_ns()

    def stamp(kind: int, mid: int, what: str, t: int | None = None) -> None:
        stamps.setdefault((kind, mid), {}).setdefault(what, now() if t is None else t)

    kinds: dict[int, int] = {}  # message id -> kind, sender side

    send = datagram.DatagramConnection.send

    def traced_send(self: Any, msg: Message, timeout_s: float | None = None) -> None:
        t = now()
        send(self, msg, timeout_s)
        if msg.values.size:
            mid = (self.peer_id << 16) | self._counter
            kinds[mid] = int(msg.kind)
            stamp(int(msg.kind), mid, "send_called", t)
            stamp(int(msg.kind), mid, "begin_sent")

    datagram.DatagramConnection.send = traced_send  # type: ignore[method-assign]

    transmit = datagram.DatagramTransport._transmit

    def traced_transmit(self: Any, conn: Any, out: Any) -> None:
        stamp(kinds.get(out.message, 0), out.message, "tx_started")
        try:
            transmit(self, conn, out)
        finally:
            stamp(kinds.get(out.message, 0), out.message, "tx_returned")

    datagram.DatagramTransport._transmit = traced_transmit  # type: ignore[method-assign]

    pace = datagram.DatagramTransport._pace

    def traced_pace(self: Any, conn: Any, packets: Any, order: Any, seq: int, *a: Any,
                    **k: Any) -> None:
        mid = int(packets.headers["message"][0])
        pace(self, conn, packets, order, seq, *a, **k)
        stamp(kinds.get(mid, 0), mid, "pass_sent" if seq == 0 else "retx_sent")

    datagram.DatagramTransport._pace = traced_pace  # type: ignore[method-assign]

    on_frame = datagram.DatagramTransport._on_frame

    def traced_on_frame(self: Any, conn: Any, frame: Any) -> None:
        if frame.type == FrameType.DONE:
            stamp(kinds.get(frame.message, 0), frame.message, "done_read")
        elif frame.type == FrameType.NACK:
            stamp(kinds.get(frame.message, 0), frame.message, "nack_read")
        elif frame.type == FrameType.END:
            rx = self._recv.rx.get(frame.message)
            if rx is not None:
                stamp(rx.kind, frame.message, "end_read")
        on_frame(self, conn, frame)

    datagram.DatagramTransport._on_frame = traced_on_frame  # type: ignore[method-assign]

    recv_batch = batch.Inbox.recv

    def traced_recv_batch(self: Any) -> int:
        n = recv_batch(self)
        reads.append((now(), int(n)))
        return int(n)

    batch.Inbox.recv = traced_recv_batch  # type: ignore[method-assign]

    add = receiver.Receiver._add

    def traced_add(self: Any, rx: Any, *a: Any, **k: Any) -> None:
        stamp(rx.kind, rx.message, "first_packet")
        add(self, rx, *a, **k)

    receiver.Receiver._add = traced_add  # type: ignore[method-assign]

    recv = datagram.DatagramConnection.recv

    def traced_recv(self: Any, timeout_s: float | None = None) -> Message:
        msg = recv(self, timeout_s)
        if msg.values.size:
            rec = self.transport.completions[-1] if self.transport.completions else None
            if rec is not None:  # one message in flight at a time: the last one is msg's
                key = (int(msg.kind), rec["message"])
                stamp(*key, "begin_read", rec["begun_ns"])
                if rec["event_ns"]:
                    stamp(*key, "xdp_event", rec["event_ns"])
                stamp(*key, "queued", rec["done_ns"])
                stamp(*key, "recv_returned", rec.get("app_ns"))
                stamps[key]["reason_" + rec["reason"]] = 1
        return msg

    datagram.DatagramConnection.recv = traced_recv  # type: ignore[method-assign]


def usage() -> dict[str, int]:
    """This process's CPU time (us) and context switches, summed over its threads."""
    cpu = os.times()
    out = {"cpu_us": int((cpu.user + cpu.system) * 1e6), "switches": 0, "involuntary": 0,
           "page_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        out["switches"] += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        out["involuntary"] += int(line.split()[1])
        except FileNotFoundError:
            pass  # a thread that just ended
    # Per thread (user, system) CPU in clock ticks, by the thread's Python name.
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    for tid, name in names.items():
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except FileNotFoundError:
            continue
        out[f"{name} user_us"] = int(fields[11]) * 1_000_000 // tick
        out[f"{name} sys_us"] = int(fields[12]) * 1_000_000 // tick
    return out


def count_reads(stats: collections.Counter[str]) -> None:
    """Count the receive loop's reads: calls, and those that found datagrams."""
    from tailcut.transports import batch

    recv = batch.Inbox.recv

    def counted(self: Any) -> int:
        n = recv(self)
        stats["rx reads"] += 1
        stats["rx batches"] += n > 0
        stats["rx datagrams"] += n
        return int(n)

    batch.Inbox.recv = counted  # type: ignore[method-assign]


def main() -> None:
    cfg = json.loads(sys.argv[1])
    stamps: Stamps = {}
    reads: collections.Counter[str] = collections.Counter()
    if cfg.get("count_reads"):
        count_reads(reads)
    socket_reads: list[tuple[int, int]] = []  # (time, datagrams) of every read, traced
    if cfg.get("trace") and cfg["transport"] != "tcp":
        trace(stamps, socket_reads)
    t = transports.get(cfg["transport"], **cfg.get("options", {}))
    v = np.random.default_rng(cfg["role"] == "ping").standard_normal(cfg["elements"]).astype(
        np.float32)
    rows = []
    used: dict[str, int] = {}
    if cfg["role"] == "pong":
        (c,) = t.listen(cfg["host"], cfg["port"], 1, 60)
        while True:
            m = c.recv(120)
            got = time.time_ns()
            if m.kind == Kind.STOP:
                end = usage()
                break
            rows.append({"kind": "PUSH", "sent_ns": m.sent_at_ns, "queued_ns": m.received_at_ns,
                         "returned_ns": got, "missing": m.missing})
            if len(rows) == WARMUP:
                used = usage()
            c.send(Message(Kind.PARAMS, m.iteration, -1, v), 60)
    else:
        c = t.connect(cfg["host"], cfg["port"], 60)
        time.sleep(0.2)  # let the peer's receive thread start
        for r in range(cfg["rounds"]):
            c.send(Message(Kind.PUSH, r, 0, v), 60)
            m = c.recv(60)
            got = time.time_ns()
            rows.append({"kind": "PARAMS", "sent_ns": m.sent_at_ns,
                         "queued_ns": m.received_at_ns, "returned_ns": got,
                         "missing": m.missing})
            if len(rows) == WARMUP:
                used = usage()
            time.sleep(cfg.get("gap_s", 0.0))  # the worker's compute, if any
        end = usage()
        c.send(Message(Kind.STOP, cfg["rounds"], 0), 30)
        time.sleep(0.2)
    stats = {**getattr(t, "stats", {}), **reads}
    # Per round after the warm-up: CPU time and context switches of this process.
    rounds = len(rows) - WARMUP
    cost = {k: (end[k] - used.get(k, 0)) / max(1, rounds) for k in end}
    print(json.dumps({cfg["role"]: cost}), file=sys.stderr)
    c.close()
    t.close()
    print(json.dumps({"messages": rows, "stamps": [[k[0], k[1], s] for k, s in stamps.items()],
                      "reads": socket_reads,
                      "stats": stats, "cost": cost,
                      "counts": collections.Counter(r["kind"] for r in rows)}))


if __name__ == "__main__":
    main()
