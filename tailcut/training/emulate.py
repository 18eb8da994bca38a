"""Emulated-loss BSP training: the PS and worker math in one process, with messages losing ranges.

No network and no processes: each iteration does what ``ps.run`` and ``worker.run``
do over a lossy bounded-loss transport, so a loss-rate sweep takes seconds per run.

- pull: the PS's PARAMS message reaches each worker with each range lost with
  probability ``loss_rate``; the worker keeps its old value for a lost parameter
  (``worker.apply_params``, the function the real worker calls);
- compute: each worker takes the gradient of its next minibatch of its shard
  (``data.shard`` and ``worker.minibatches``, seeded as the real worker seeds them);
- push: each worker's gradient reaches the PS with each range lost with
  probability ``loss_rate``; the PS combines what arrived by its aggregation rule
  (``syncmodes.average`` and ``aggregation.combine``, the functions the real PS calls; by
  default each coordinate's mean over the workers that delivered it, a coordinate
  nobody delivered unchanged), then takes the SGD step.

How loss is applied (``LossModel``) is a choice with consequences:

- ``granularity="packet"`` (default) loses whole packets: a message is cut into
  ranges of ``range_floats`` consecutive float32 values (1400 payload bytes, 350
  floats, as in the APNet'19 paper's range-indexed packets) and each range is
  lost or kept as one. This is what a real network does to the bounded-loss
  transport, and it correlates loss: a lost range takes a whole bias vector or a
  block of embedding rows from that worker at once.
- ``granularity="coordinate"`` loses each float independently, as the paper's own
  emulation did ("emulating the data drops for each parameter uniformly at
  random"); the same mean loss, much less variance per layer.
- ``direction`` is ``"push"`` (gradients only, as the paper's emulation),
  ``"pull"`` (parameters only) or ``"both"`` (default: over a lossy network both
  directions of every message are exposed to loss).

With loss_rate = 0 no mask is made at all, so the run is the real BSP job's math exactly:
same initial parameters, minibatches and averaging as ``tailcut run`` with tcp.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from tailcut.ml import data, models
from tailcut.training import aggregation as rules
from tailcut.training import ps, syncmodes, worker
from tailcut.transports import base
from tailcut.transports.base import Kind, Message

# Payload bytes of one packet, as the APNet'19 paper sizes them (1400 B = 350 float32).
RANGE_BYTES = 1400
GRANULARITIES = ("packet", "coordinate")
DIRECTIONS = ("push", "pull", "both")


@dataclass(frozen=True)
class LossModel:
    """Which values of a message are lost: ``loss_rate`` (the fraction lost; the APNet'19
    paper's p) per range or per coordinate. Not the bounded-loss transport's ``p``,
    which is the fraction delivered."""

    loss_rate: float = 0.0
    granularity: str = "packet"
    direction: str = "both"
    range_bytes: int = RANGE_BYTES

    def __post_init__(self) -> None:
        if not 0.0 <= self.loss_rate <= 1.0:
            raise ValueError(f"loss_rate={self.loss_rate}: a loss rate must be in [0, 1]")
        if self.granularity not in GRANULARITIES:
            raise ValueError(
                f"granularity={self.granularity!r}: must be one of {', '.join(GRANULARITIES)}"
            )
        if self.direction not in DIRECTIONS:
            raise ValueError(
                f"direction={self.direction!r}: must be one of {', '.join(DIRECTIONS)}"
            )
        if self.range_bytes < 4 or self.range_bytes % 4:
            raise ValueError(
                f"range_bytes={self.range_bytes}: must be a positive multiple of 4 "
                "(no float32 is split across packets)"
            )

    @property
    def range_floats(self) -> int:
        return self.range_bytes // 4

    def mask(self, size: int, rng: np.random.Generator) -> np.ndarray | None:
        """Delivered-coordinates mask for one message of ``size`` floats (None: all arrived)."""
        if self.loss_rate == 0.0:
            return None
        if self.granularity == "coordinate":
            return rng.random(size) >= self.loss_rate
        ranges = math.ceil(size / self.range_floats)
        kept = rng.random(ranges) >= self.loss_rate
        return np.repeat(kept, self.range_floats)[:size]

    def lossy(self, kind: Kind) -> bool:
        """Whether messages of this kind cross the lossy path."""
        if kind == Kind.PUSH:
            return self.direction in ("push", "both")
        return self.direction in ("pull", "both")


@dataclass
class Run:
    """How one emulated job went."""

    converged: bool
    epochs: int
    iterations: int
    final_accuracy: float
    accuracy_per_epoch: list[float] = field(default_factory=list)
    compute_s: float = 0.0  # median per iteration: the slowest worker's gradient + the PS step
    eval_s: float = 0.0  # median per epoch: the PS's test-set evaluation
    wall_s: float = 0.0  # this emulation's own wall time
    delivered: float = 1.0  # share of pushed and pulled floats that arrived


def train(
    name: str,
    loss: LossModel,
    *,
    seed: int = 0,
    num_workers: int = 4,
    learning_rate: float | None = None,
    batch_size: int | None = None,
    target_accuracy: float | None = None,
    max_epochs: int | None = None,
    dataset: data.Dataset | None = None,
    aggregation: str = "mean",
) -> Run:
    """Train model ``name`` under ``loss`` until its target or ``max_epochs``; settings
    left None come from the model's registry entry. ``aggregation`` is the PS's rule
    (``spec.training.aggregation``)."""
    rules.check(aggregation)
    started = time.perf_counter()
    entry = models.info(name)
    lr = np.float32(entry.learning_rate if learning_rate is None else learning_rate)
    batch = entry.batch_size if batch_size is None else batch_size
    target = entry.target_accuracy if target_accuracy is None else target_accuracy
    limit = entry.max_epochs if max_epochs is None else max_epochs
    ds = models.dataset(name, seed) if dataset is None else dataset
    model = models.create(name, ds)
    n = model.num_params

    # As the real roles: the PS and every worker start from the seed's parameters.
    params = model.init_params(np.random.default_rng(seed))
    copies = [params.copy() for _ in range(num_workers)]
    shards = [data.shard(ds.x_train, ds.y_train, i, num_workers) for i in range(num_workers)]
    batches = [
        worker.minibatches(len(shards[i][0]), batch, np.random.default_rng([seed, 1 + i]))
        for i in range(num_workers)
    ]
    loss_rng = np.random.default_rng([seed, 0x1055])  # its own stream: minibatches stay as real
    per_epoch = ps.iterations_per_epoch(len(ds.x_train), batch, num_workers)

    iteration = epoch = 0
    sent = arrived = 0
    accuracies: list[float] = []
    compute: list[float] = []
    evals: list[float] = []
    accuracy = 0.0
    while True:
        slowest = 0.0
        pushes = []
        for w in range(num_workers):
            pull_mask = loss.mask(n, loss_rng) if loss.lossy(Kind.PARAMS) else None
            pulled = Message(Kind.PARAMS, iteration, base.PS_SENDER, params, pull_mask)
            worker.apply_params(copies[w], pulled)
            t0 = time.perf_counter()
            x, y = shards[w]
            rows = next(batches[w])
            _, grad = model.loss_and_grad(copies[w], x[rows], y[rows])
            slowest = max(slowest, time.perf_counter() - t0)
            push_mask = loss.mask(n, loss_rng) if loss.lossy(Kind.PUSH) else None
            pushes.append(Message(Kind.PUSH, iteration, w, grad, push_mask))
            for mask in (pull_mask, push_mask):
                sent += n
                arrived += n if mask is None else int(np.count_nonzero(mask))
        t0 = time.perf_counter()
        step, _ = syncmodes.average(pushes, n, aggregation)
        params -= lr * step
        compute.append(slowest + time.perf_counter() - t0)
        iteration += 1
        if iteration % per_epoch == 0:
            epoch += 1
            t0 = time.perf_counter()
            _, accuracy = model.evaluate(params, ds.x_test, ds.y_test)
            evals.append(time.perf_counter() - t0)
            accuracies.append(accuracy)
            if accuracy >= target or epoch >= limit or not np.isfinite(params).all():
                break
    return Run(
        converged=accuracy >= target,
        epochs=epoch,
        iterations=iteration,
        final_accuracy=accuracy,
        accuracy_per_epoch=accuracies,
        compute_s=float(np.median(compute)),
        eval_s=float(np.median(evals)),
        wall_s=time.perf_counter() - started,
        delivered=arrived / max(sent, 1),
    )
