"""A layer-by-layer PS exchange over real TCP between pod namespaces, tagged per layer.

This is the testbed side of the CadentFlow comparison: one PS and n workers, one TCP
connection per (worker, layer) so each tensor is its own flow (the per-tensor case of
tailcut.simulate), carrying the layer's parameters PS -> worker (pull) and then its
gradient worker -> PS (push). Per iteration a worker runs the forward pass layer by
layer as the parameters arrive, then the backward pass in reverse, pushing each
gradient when it is ready; the iteration ends when the PS has every gradient.

Compute is emulated by sleeping each layer's forward/backward time (as the paper's
simulation uses traced compute times); the bytes are real and cross the shaped veths.
With `tagged=True` every socket carries IP_TOS of its layer's priority level (earlier
layers first, tailcut.scheduling.tags), which the DSCP classifier turns into an HTB
class; with `tagged=False` every flow shares the default class (TCP fair share).
With `paced=True` (coflow) every sender socket is capped by SO_MAX_PACING_RATE at
its flow's MADD rate (tailcut.scheduling.madd): a `Pacer` recomputes the rates of the
active flows whenever a flow starts or ends, from their remaining bytes (counted at
the receiver), as Varys' controller and the simulator's `coflow` do. One iteration's
pulls are one coflow, its pushes another.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from tailcut.net import netns
from tailcut.net.topology import Topology
from tailcut.scheduling import madd, pacing, tags

PORT = 47000
CHUNK = 1 << 16
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class LayerLoad:
    """One tensor of the exchanged model: bytes each way and compute seconds."""

    name: str
    bytes: int
    fwd_s: float
    bwd_s: float


@dataclass
class Iteration:
    """Times of one iteration, in seconds from its start."""

    seconds: float
    pull_start_s: dict[tuple[int, int], float] = field(default_factory=dict)  # PS starts sending
    pull_done_s: dict[tuple[int, int], float] = field(default_factory=dict)  # (worker, layer)
    push_done_s: dict[tuple[int, int], float] = field(default_factory=dict)
    forward_done_s: dict[int, float] = field(default_factory=dict)


level_of = tags.level_of  # kept here too: the exchange's default tagging


def _recv_exact(sock: socket.socket, size: int, buf: bytearray,
                progress: "Callable[[int], None] | None" = None) -> None:
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[:min(CHUNK, size - got)])
        if n == 0:
            raise ConnectionError("peer closed the connection mid-message")
        got += n
        if progress is not None:
            progress(got)


class Pacer:
    """The coflow controller: MADD rates for the active flows, set on their sockets.

    A flow is keyed (direction, worker, layer) and belongs to the coflow (direction,
    iteration). start() and finish() recompute every active flow's rate from its
    remaining bytes (size - what its receiver has read) and set each sender's
    SO_MAX_PACING_RATE; received() only records progress. With `period_s`, a
    thread (run()/stop()) also recomputes every `period_s` while flows are active, so
    a flow that got ahead of its rate is slowed to end with the others."""

    def __init__(self, capacity: dict[str, float], period_s: float | None = None) -> None:
        self.capacity = capacity
        self.period_s = period_s
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        # The rate of a flow whose links another coflow fills: slow, never stopped.
        self.floor = min(capacity.values()) / 1000
        self._lock = threading.Lock()
        self._active: dict[tuple[str, int, int], tuple[tuple[str, int], socket.socket,
                                                       tuple[str, ...], int]] = {}
        self._got: dict[tuple[str, int, int], int] = {}

    def start(self, key: tuple[str, int, int], coflow: tuple[str, int], sock: socket.socket,
              links: tuple[str, ...], size: int) -> None:
        self.start_many([(key, coflow, sock, links, size)])

    def start_many(self, flows: list[tuple[tuple[str, int, int], tuple[str, int],
                                           socket.socket, tuple[str, ...], int]]) -> None:
        """Start several flows at once: a coflow known in advance (the pulls) gets its
        rates before any of its flows sends, not one flow at a time."""
        with self._lock:
            for key, coflow, sock, links, size in flows:
                if key not in self._active:
                    self._active[key] = (coflow, sock, links, size)
                    self._got[key] = 0
            self._reassign()

    def run(self) -> None:
        """Start the periodic recomputation (if `period_s`); stop() ends it."""
        if self.period_s is None or self._thread is not None:
            return

        def loop() -> None:
            while not self._stopped.wait(self.period_s):
                with self._lock:
                    if self._active:
                        self._reassign()

        self._thread = threading.Thread(target=loop, daemon=True, name="pacer")
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def received(self, key: tuple[str, int, int], got: int) -> None:
        self._got[key] = got  # a plain store: the GIL makes it atomic

    def finish(self, key: tuple[str, int, int]) -> None:
        with self._lock:
            self._active.pop(key, None)
            self._reassign()

    def _reassign(self) -> None:
        coflows: dict[Hashable, list[madd.Flow]] = {}   # by (direction, iteration)
        for key, (cid, _, links, size) in self._active.items():
            left = max(1, size - self._got.get(key, 0))
            coflows.setdefault(cid, []).append(madd.Flow(key, links, left))
        rates = madd.allocate(coflows, self.capacity, self.floor)
        for key, (_, sock, _, _) in self._active.items():
            pacing.set_rate(sock, max(rates[key], self.floor))


UNPACED_SEGMENTS = 10  # tcp_update_skb_after_send: "does not pace first 10 MSS"


def _warm_up(sender: socket.socket, receiver: socket.socket) -> None:
    """Send UNPACED_SEGMENTS one-byte segments (TCP_NODELAY: one segment per send,
    each waited for) and read them."""
    sender.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(1)
    for _ in range(UNPACED_SEGMENTS):
        sender.sendall(b"w")
        _recv_exact(receiver, 1, buf)


def _tos(sock: socket.socket, level: int | None) -> None:
    if level is not None:
        from tailcut.datapath import classifier
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, classifier.tos_of(level))


def run(topo: Topology, layers: list[LayerLoad], iterations: int, tagged: bool,
        levels: int = 4, port: int = PORT, timeout_s: float = 120.0,
        reverse_stagger_s: float = 0.0,
        level_by_layer: list[int] | None = None, paced: bool = False,
        pacer_period_s: float | None = None,
        pace_capacity: dict[str, float] | None = None) -> list[Iteration]:
    """Run `iterations` iterations of the exchange on a built topology (ps-0 and every
    worker of it) and return their timings. Raises TimeoutError past `timeout_s`.
    `reverse_stagger_s` > 0 makes the PS start later layers first, each that much
    before the one below it: the worst send order, which only the classes can undo.
    `level_by_layer` (e.g. from tags.resolve) overrides the default level per layer.
    `paced` runs the coflow policy: every flow paced at its MADD rate (Pacer), also
    recomputed every `pacer_period_s` if given, over the links' capacities
    (madd.capacities) or `pace_capacity` (a bench's override: pace as if the links
    were that fast)."""
    ps = topo.pod("ps-0")
    workers = [p for p in topo.pods if p.role == "worker"]
    n_layers = len(layers)
    if level_by_layer is not None and len(level_by_layer) != n_layers:
        raise ValueError(f"level_by_layer has {len(level_by_layer)} entries for "
                         f"{n_layers} layers")
    chosen = level_by_layer or [level_of(k, n_layers, levels) for k in range(n_layers)]
    level = [chosen[k] if tagged else None for k in range(n_layers)]
    listeners, ps_socks, w_socks = [], {}, {}
    try:
        for w, pod in enumerate(workers):
            with netns.entered(pod.netns):
                lst = socket.socket()
                lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                lst.bind((pod.ip, port))
                lst.listen(n_layers)
                lst.settimeout(CONNECT_TIMEOUT_S)
            listeners.append(lst)
            for k in range(n_layers):
                with netns.entered(ps.netns):
                    s = socket.socket()
                _tos(s, level[k])
                s.settimeout(CONNECT_TIMEOUT_S)
                s.connect((pod.ip, port))
                s.sendall(k.to_bytes(4, "big"))
                conn, _ = lst.accept()
                conn.settimeout(None)
                s.settimeout(None)
                got = bytearray(4)
                _recv_exact(conn, 4, got)
                kk = int.from_bytes(got, "big")
                _tos(conn, level[kk])
                ps_socks[(w, k)] = s
                w_socks[(w, kk)] = conn
        pacer = None
        if paced:
            # Linux does not pace a connection's first 10 data segments (as sch_fq):
            # spend them now, one byte each way, so every paced flow is paced whole.
            for key in ps_socks:
                _warm_up(ps_socks[key], w_socks[key])
                _warm_up(w_socks[key], ps_socks[key])
            pacer = Pacer(pace_capacity or madd.capacities(topo), pacer_period_s)
            paths = {w: (madd.path(topo, ps.name, pod.name), madd.path(topo, pod.name, ps.name))
                     for w, pod in enumerate(workers)}
        return _iterate(layers, len(workers), iterations, ps_socks, w_socks, timeout_s,
                        reverse_stagger_s, pacer, paths if paced else {})
    finally:
        for s in list(ps_socks.values()) + list(w_socks.values()) + listeners:
            s.close()


def _iterate(layers: list[LayerLoad], n_workers: int, iterations: int,
             ps_socks: dict[tuple[int, int], socket.socket],
             w_socks: dict[tuple[int, int], socket.socket], timeout_s: float,
             reverse_stagger_s: float, pacer: Pacer | None = None,
             paths: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] | None = None
             ) -> list[Iteration]:
    n_layers = len(layers)
    paths = paths or {}
    keys = [(w, k) for w in range(n_workers) for k in range(n_layers)]
    start = [threading.Event() for _ in range(iterations)]
    arrived = [{key: threading.Event() for key in keys} for _ in range(iterations)]
    ready = [{key: threading.Event() for key in keys} for _ in range(iterations)]
    finished = [threading.Semaphore(0) for _ in range(iterations)]
    records = [Iteration(0.0) for _ in range(iterations)]
    t0 = [0.0] * iterations
    errors: list[BaseException] = []
    payload = bytes(max(l.bytes for l in layers))

    def guarded(fn: Callable[..., None]) -> Callable[..., None]:
        def body(*args: int) -> None:
            try:
                fn(*args)
            except BaseException as err:  # reported by the coordinator
                errors.append(err)
                for it in range(iterations):
                    finished[it].release(len(keys))
                    for ev in list(arrived[it].values()) + list(ready[it].values()) + [start[it]]:
                        ev.set()
        return body

    @guarded
    def ps_side(w: int, k: int) -> None:
        sock, size, buf = ps_socks[(w, k)], layers[k].bytes, bytearray(layers[k].bytes)
        for it in range(iterations):
            start[it].wait()
            if reverse_stagger_s:
                time.sleep((n_layers - 1 - k) * reverse_stagger_s)
            records[it].pull_start_s[(w, k)] = time.monotonic() - t0[it]
            if pacer is not None and reverse_stagger_s:
                # Staggered pulls join their coflow as they start; otherwise the
                # coordinator started the whole pull coflow at once.
                pacer.start(("pull", w, k), ("pull", it), sock, paths[w][0], size)
            sock.sendall(memoryview(payload)[:size])
            _recv_exact(sock, size, buf, None if pacer is None else
                        lambda got: pacer.received(("push", w, k), got))
            records[it].push_done_s[(w, k)] = time.monotonic() - t0[it]
            if pacer is not None:
                pacer.finish(("push", w, k))
            finished[it].release()

    @guarded
    def worker_side(w: int, k: int) -> None:
        sock, size, buf = w_socks[(w, k)], layers[k].bytes, bytearray(layers[k].bytes)
        for it in range(iterations):
            _recv_exact(sock, size, buf, None if pacer is None else
                        lambda got: pacer.received(("pull", w, k), got))
            records[it].pull_done_s[(w, k)] = time.monotonic() - t0[it]
            if pacer is not None:
                pacer.finish(("pull", w, k))
            arrived[it][(w, k)].set()
            ready[it][(w, k)].wait()
            if pacer is not None:
                pacer.start(("push", w, k), ("push", it), sock, paths[w][1], size)
            sock.sendall(memoryview(payload)[:size])

    @guarded
    def compute(w: int) -> None:
        for it in range(iterations):
            for k, layer in enumerate(layers):
                arrived[it][(w, k)].wait()
                time.sleep(layer.fwd_s)
            records[it].forward_done_s[w] = time.monotonic() - t0[it]
            for k in range(n_layers - 1, -1, -1):
                time.sleep(layers[k].bwd_s)
                ready[it][(w, k)].set()

    if pacer is not None:
        pacer.run()
    threads = [threading.Thread(target=ps_side, args=key, daemon=True) for key in keys]
    threads += [threading.Thread(target=worker_side, args=key, daemon=True) for key in keys]
    threads += [threading.Thread(target=compute, args=(w,), daemon=True)
                for w in range(n_workers)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    try:
        for it in range(iterations):
            t0[it] = time.monotonic()
            if pacer is not None and not reverse_stagger_s:
                # One iteration's pulls are released together: one coflow, paced up front.
                pacer.start_many([(("pull", w, k), ("pull", it), ps_socks[(w, k)],
                                   paths[w][0], layers[k].bytes) for w, k in keys])
            start[it].set()
            for _ in keys:
                if not finished[it].acquire(timeout=max(0.0, deadline - time.monotonic())):
                    raise TimeoutError(f"iteration {it} did not finish within {timeout_s} s")
            if errors:
                raise errors[0]
            records[it].seconds = time.monotonic() - t0[it]
    finally:
        if pacer is not None:
            pacer.stop()
    for t in threads:
        t.join(timeout=5.0)
    return records
