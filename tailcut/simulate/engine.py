"""The flow-level simulator: PS training jobs on a fabric, one event loop, three policies.

Per iteration of a job (BSP, as in the paper's simulation):

1. Pull (FP CadentFlow): every PS sends each layer it holds to every worker, all
   released at the iteration start.
2. Forward: a worker computes layer k once layer k's parameters have arrived and
   layer k-1 is done.
3. Backward: after the last forward layer, layers run in reverse; the gradient of
   layer k is released as a push flow (worker -> its PS) when its backward ends.
4. The iteration ends when every push has arrived; the next one starts then.
   (Inference jobs stop after step 2: one CadentFlow plus the forward pass.)

Layers go to parameter servers greedily by size, the least loaded first (TensorFlow's
GreedyLoadBalancingStrategy). Between events every active flow runs at the rate the
policy gives it (a fluid model: no packets, no slow start). A flow between a worker and
a PS on the same node (colocated) crosses no link and arrives when it is released.

Policies: `fair` is TCP: one connection per (src, dst) pair carrying its messages one
after the other in the best order (the paper's baseline "transfers the parameters in
the best possible order from a given node"), connections max-min fair; with
`tcp="per-tensor"` every message is its own flow, all open at once and max-min fair
(what a framework that issues every receive at once over multiplexed streams gets);
with `tcp="random"` each connection sends its messages in a random order (TensorFlow's
order is arbitrary, as TicTac and P3 observed). `coflow` is
Varys' MADD per coflow (a job's pulls of one iteration, or its pushes). `cadentflow`
is strict priority by tag: `tags="priority"` uses the layer index (earlier layers
first), `tags="deadline"` the absolute deadline (earliest deadline first); see
tailcut.scheduling.tags. `tags="staggered"` is not the paper's: strict priority by
(worker, layer), all of worker 0's messages before worker 1's, to show what an order
*across* workers can save where a PS sends the same layer to every worker (the
paper's tags are the same at every worker, so they cannot say which worker goes first).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from tailcut.scheduling import tags as tagging
from tailcut.simulate import allocate
from tailcut.simulate.architectures import Architecture
from tailcut.simulate.topology import Fabric

Policy = Literal["fair", "coflow", "cadentflow"]
POLICIES: tuple[str, ...] = ("fair", "coflow", "cadentflow")
PULL, PUSH = 0, 1
_DONE_FRACTION = 1e-9
_MAX_HOPS = 4  # longest path: NIC up, rack up, rack down, NIC down


@dataclass
class Job:
    """One training (or inference) job placed on fabric nodes."""

    name: str
    arch: Architecture
    workers: list[int]
    ps: list[int]
    iterations: int = 1
    start_s: float = 0.0
    inference: bool = False
    # Per-worker compute time multipliers (stragglers); None = identical workers.
    worker_slowdown: list[float] | None = None
    # Filled in by the simulation:
    iteration_s: list[float] = field(default_factory=list)

    def slowdown(self, worker: int) -> float:
        return 1.0 if self.worker_slowdown is None else self.worker_slowdown[worker]

    def ps_of_layer(self) -> list[int]:
        """Greedy placement by size: each layer to the least-loaded PS (index)."""
        load = [0] * len(self.ps)
        owner = []
        for layer in self.arch.layers:
            i = min(range(len(self.ps)), key=lambda j: (load[j], j))
            owner.append(i)
            load[i] += layer.bytes
        return owner


@dataclass
class Flow:
    """One message: a layer's parameters (pull) or gradient (push) between two nodes."""

    job: int
    iteration: int
    phase: int
    worker: int
    layer: int
    src: int
    dst: int
    size: float
    release_s: float
    priority: float
    deadline_s: float
    remaining: float = 0.0
    order: float = 0.0       # position in its connection's queue under fair TCP
    start_s: float = -1.0
    end_s: float = -1.0


@dataclass
class Result:
    """What one simulation produced."""

    policy: str
    jobs: list[Job]
    flows: list[Flow]
    events: int

    def mean_iteration_s(self, job: int = 0, skip: int = 0) -> float:
        times = self.jobs[job].iteration_s[skip:]
        return float(np.mean(times)) if times else float("nan")


class Simulation:
    """One run of `jobs` on `fabric` under `policy`."""

    def __init__(self, fabric: Fabric, jobs: list[Job], policy: str,
                 tags: Literal["priority", "deadline", "staggered"] = "priority",
                 tcp: Literal["ordered", "per-tensor", "random"] = "ordered",
                 seed: int = 0) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy {policy!r}: must be one of {', '.join(POLICIES)}")
        if tags not in ("priority", "deadline", "staggered"):
            raise ValueError(f"tags {tags!r}: must be 'priority', 'deadline' or 'staggered'")
        for job in jobs:
            for node in job.workers + job.ps:
                if not 0 <= node < fabric.nodes:
                    raise ValueError(f"job {job.name}: node {node} is not on the fabric "
                                     f"(0..{fabric.nodes - 1})")
        self.fabric = fabric
        self.jobs = jobs
        self.policy = policy
        self.tags = tags
        if tcp not in ("ordered", "per-tensor", "random"):
            raise ValueError(f"tcp {tcp!r}: must be 'ordered', 'per-tensor' or 'random'")
        self.tcp = tcp
        self._rng = np.random.default_rng(seed)
        self.caps = np.r_[fabric.capacities_byte(), np.inf]  # last: dummy padding link
        self.flows: list[Flow] = []
        # Per-flow state the event loop works on, as arrays indexed by flow id.
        self._arr: dict[str, np.ndarray] = {
            "path": np.zeros((0, _MAX_HOPS), dtype=np.int64),
            "rem": np.zeros(0), "size": np.zeros(0), "prio": np.zeros(0),
            "deadline": np.zeros(0), "order": np.zeros(0),
            "layer": np.zeros(0, dtype=np.int64), "conn": np.zeros(0, dtype=np.int64),
            "coflow": np.zeros(0, dtype=np.int64)}
        self.now = 0.0
        self.events = 0
        self._pending: list[tuple[float, int]] = []   # (release time, flow id)
        self._timers: list[tuple[float, int, int, int, int]] = []  # (t, seq, job, worker, layer)
        self._seq = 0
        self._owner = [job.ps_of_layer() for job in jobs]
        self._fwd_tags = [tagging.forward_deadlines_s([l.fwd_s for l in job.arch.layers])
                          for job in jobs]
        # Per job: state of the current iteration.
        self._iter = [0] * len(jobs)
        self._iter_start = [0.0] * len(jobs)
        self._arrived: list[np.ndarray] = [np.zeros((0, 0), bool)] * len(jobs)
        self._next_fwd: list[list[int]] = [[] for _ in jobs]
        self._busy: list[list[bool]] = [[] for _ in jobs]
        self._open: list[int] = [0] * len(jobs)   # flows + workers still to finish

    # -- building blocks -------------------------------------------------------
    def _add_flow(self, flow: Flow) -> None:
        flow.remaining = flow.size
        flow.order = float(self._rng.random()) if self.tcp == "random" else flow.priority
        fid = len(self.flows)
        self.flows.append(flow)
        if fid == len(self._arr["rem"]):
            self._grow()
        a = self._arr
        path = self.fabric.path(flow.src, flow.dst)
        a["path"][fid] = len(self.caps) - 1
        a["path"][fid, :len(path)] = path
        a["rem"][fid] = a["size"][fid] = flow.size
        a["prio"][fid] = flow.priority
        if self.tags == "staggered":
            a["prio"][fid] += flow.worker * len(self.jobs[flow.job].arch.layers)
        a["deadline"][fid] = flow.deadline_s
        a["order"][fid] = flow.order
        a["layer"][fid] = flow.layer
        # A connection is one direction of one (worker, PS) pair: pulls and pushes
        # between two nodes that are each a worker and a PS (colocated) never share one.
        a["conn"][fid] = ((flow.job * self.fabric.nodes + flow.src) * self.fabric.nodes
                          + flow.dst) * 2 + flow.phase
        a["coflow"][fid] = (flow.job * 1_000_003 + flow.iteration) * 2 + flow.phase
        heapq.heappush(self._pending, (flow.release_s, fid))

    def _grow(self) -> None:
        """Double the per-flow arrays (amortised O(1) per flow)."""
        size = max(1024, 2 * len(self._arr["rem"]))
        for name, old in self._arr.items():
            new = np.zeros((size,) + old.shape[1:], dtype=old.dtype)
            new[:len(old)] = old
            self._arr[name] = new

    def _timer(self, t: float, job: int, worker: int, layer: int) -> None:
        self._seq += 1
        heapq.heappush(self._timers, (t, self._seq, job, worker, layer))

    def _start_iteration(self, j: int, t: float) -> None:
        job = self.jobs[j]
        layers = job.arch.layers
        self._iter_start[j] = t
        self._arrived[j] = np.zeros((len(job.workers), len(layers)), bool)
        self._next_fwd[j] = [0] * len(job.workers)
        self._busy[j] = [False] * len(job.workers)
        self._open[j] = len(job.workers)  # each worker closes once it finished computing
        for w, node in enumerate(job.workers):
            for k, layer in enumerate(layers):
                ps = job.ps[self._owner[j][k]]
                deadline = t + self._fwd_tags[j][k]
                self._add_flow(Flow(j, self._iter[j], PULL, w, k, ps, node, layer.bytes,
                                    t, tagging.forward_priority(k), deadline))
                self._open[j] += 1

    def _forward_done(self, j: int, w: int, k: int, t: float) -> None:
        job = self.jobs[j]
        layers = job.arch.layers
        self._next_fwd[j][w] = k + 1
        self._busy[j][w] = False
        if k + 1 < len(layers):
            if self._arrived[j][w, k + 1]:
                self._busy[j][w] = True
                self._timer(t + layers[k + 1].fwd_s * job.slowdown(w), j, w, k + 1)
            return
        if job.inference:
            self._close(j, t)
            return
        release = [0.0] * len(layers)
        clock = t
        for i in range(len(layers) - 1, -1, -1):
            clock += layers[i].bwd_s * job.slowdown(w)
            release[i] = clock
        for i, layer in enumerate(layers):
            self._add_flow(Flow(j, self._iter[j], PUSH, w, i, job.workers[w],
                                job.ps[self._owner[j][i]], layer.bytes, release[i],
                                tagging.backward_priority(i, len(layers)), clock))
            self._open[j] += 1
        # The worker's own compute ends at `clock`; a zero-size timer closes it then.
        self._timer(clock, j, w, -1)

    def _close(self, j: int, t: float) -> None:
        self._open[j] -= 1
        if self._open[j] == 0:
            job = self.jobs[j]
            job.iteration_s.append(t - self._iter_start[j])
            self._iter[j] += 1
            if self._iter[j] < job.iterations:
                self._start_iteration(j, t)

    def _flow_done(self, fid: int, t: float) -> None:
        flow = self.flows[fid]
        flow.end_s = t
        j = flow.job
        if flow.phase == PULL:
            self._arrived[j][flow.worker, flow.layer] = True
            w = flow.worker
            if not self._busy[j][w] and self._next_fwd[j][w] == flow.layer:
                self._busy[j][w] = True
                job = self.jobs[j]
                self._timer(t + job.arch.layers[flow.layer].fwd_s * job.slowdown(w), j, w,
                            flow.layer)
        self._close(j, t)

    # -- rates -----------------------------------------------------------------
    def _rates(self, act: np.ndarray) -> np.ndarray:
        """Rates of the active flows `act` (ids) under the policy, in bytes/s."""
        a = self._arr
        paths = a["path"][act]
        residual = self.caps.copy()
        if self.policy == "fair" and self.tcp == "per-tensor":
            # Every message its own TCP flow, all open at once (gRPC streams).
            return allocate.max_min(paths, residual)
        if self.policy == "fair":
            # One TCP connection per (src, dst); only its head-of-line message moves.
            rates = np.zeros(len(act))
            conn = a["conn"][act]
            order = np.lexsort((a["layer"][act], a["order"][act], conn))
            first = order[np.r_[True, conn[order][1:] != conn[order][:-1]]]
            rates[first] = allocate.max_min(paths[first], residual)
            return rates
        if self.policy == "coflow":
            return allocate.madd(paths, a["rem"][act], a["coflow"][act], residual)
        if self.tags in ("priority", "staggered"):
            key = a["prio"][act]
        else:
            # Earliest deadline first. Flows with equal deadlines (a pass's pushes all
            # share the end of computation) form one max-min fair group: the deadline
            # gives no reason to order them, and ordering them can idle a link.
            key = a["deadline"][act]
        return allocate.strict(paths, key, residual)

    # -- loop ------------------------------------------------------------------
    def run(self, max_events: int = 10_000_000) -> Result:
        for j, job in enumerate(self.jobs):
            self._iter[j] = 0
            job.iteration_s.clear()
            self._start_iteration(j, job.start_s)
        act = np.zeros(0, dtype=np.int64)
        while len(act) or self._pending or self._timers:
            self.events += 1
            if self.events > max_events:
                raise RuntimeError(f"simulation did not finish within {max_events} events")
            rem = self._arr["rem"]
            rates = self._rates(act) if len(act) else np.zeros(0)
            with np.errstate(divide="ignore", invalid="ignore"):
                finish = np.where(rates > 0, rem[act] / rates, np.inf)
            dt = float(finish.min()) if len(act) else np.inf
            if self._pending:
                dt = min(dt, self._pending[0][0] - self.now)
            if self._timers:
                dt = min(dt, self._timers[0][0] - self.now)
            if not np.isfinite(dt):
                raise RuntimeError("simulation stalled: active flows get no bandwidth "
                                   "and nothing else is due")
            dt = max(dt, 0.0)
            self.now += dt
            if len(act):
                rem[act] -= rates * dt
                done = rem[act] <= _DONE_FRACTION * self._arr["size"][act] + 1e-6
                for fid in act[done]:
                    rem[fid] = 0.0
                    self.flows[fid].remaining = 0.0
                    self._flow_done(int(fid), self.now)
                act = act[~done]
            new = []
            while self._timers and self._timers[0][0] <= self.now + 1e-12:
                _, _, j, w, k = heapq.heappop(self._timers)
                if k < 0:
                    self._close(j, self.now)
                else:
                    self._forward_done(j, w, k, self.now)
            while self._pending and self._pending[0][0] <= self.now + 1e-12:
                _, fid = heapq.heappop(self._pending)
                self.flows[fid].start_s = self.now
                if self.flows[fid].src == self.flows[fid].dst:
                    # Colocated worker and PS: a copy in memory, no link to cross.
                    self._arr["rem"][fid] = 0.0
                    self._flow_done(fid, self.now)
                    continue
                new.append(fid)
            if new:
                act = np.r_[act, np.array(new, dtype=np.int64)]
        for fid, flow in enumerate(self.flows):
            flow.remaining = float(self._arr["rem"][fid])
        return Result(self.policy, self.jobs, self.flows, self.events)
