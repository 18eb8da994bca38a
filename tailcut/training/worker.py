"""Worker role for BSP SGD: take the PS's parameters, push the gradient of one minibatch.

The worker connects to the PS (retrying: the PS may start later), says HELLO with
its index, then answers every PARAMS(i) with PUSH(i), the gradient of the next
``batch_size`` examples of its shard, until STOP. Parameter coordinates missing
from a PARAMS message keep their previous value; before the first PARAMS that is
the initial value, which the worker computes from the seed exactly as the PS does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tailcut import errors, transports
from tailcut.training import data, models, records
from tailcut.training.config import RoleConfig
from tailcut.transports import base
from tailcut.transports.base import Kind, Message

# A worker waits this much longer than the job's timeout_s before giving up on the
# PS: the PS enforces the job's timeout and may have started after this worker.
GRACE_S = 30.0


class PSGone(errors.RunError):
    """The parameter server closed the connection, broke the protocol or fell silent."""


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
    deadline = time.monotonic() + cfg.timeout_s + GRACE_S
    dataset = models.dataset(cfg.model, cfg.seed)
    model = models.create(cfg.model, dataset)
    x, y = data.shard(dataset.x_train, dataset.y_train, cfg.index, cfg.num_workers)
    # Same seed as the PS's init: a coordinate missing from the first PARAMS then
    # still has the value the PS started from.
    params = model.init_params(np.random.default_rng(cfg.seed))
    batches = minibatches(len(x), cfg.batch_size, np.random.default_rng([cfg.seed, 1 + cfg.index]))
    options = {k: v for k, v in cfg.transport.items() if k != "type"}
    transport = transports.get(cfg.transport["type"], **options)
    where = f"parameter server at {cfg.ps_host}:{cfg.ps_port}"
    log_path = Path(cfg.results_dir) / records.messages_filename("worker", cfg.index)

    pushed = 0
    iteration = -1
    conn: base.Connection | None = None
    try:
        with records.CsvLog(log_path, records.MESSAGE_FIELDS) as log:
            try:
                conn = transport.connect(cfg.ps_host, cfg.ps_port, _left(deadline))
                conn.send(Message(Kind.HELLO, 0, cfg.index), _left(deadline))
                while True:
                    msg = conn.recv(_left(deadline))
                    log.write(records.message_row(msg, cfg.index))
                    if msg.kind == Kind.STOP:
                        break
                    if msg.kind != Kind.PARAMS:
                        raise PSGone(
                            f"{where} sent {msg.kind.name}; a worker expects PARAMS or STOP"
                        )
                    iteration = msg.iteration
                    apply_params(params, msg)
                    rows = next(batches)
                    _, grad = model.loss_and_grad(params, x[rows], y[rows])
                    conn.send(Message(Kind.PUSH, iteration, cfg.index, grad), _left(deadline))
                    pushed += 1
            except base.PeerClosed as err:
                raise PSGone(f"{where} went away after iteration {iteration}: {err}") from err
            except base.TransportTimeout as err:
                raise PSGone(
                    f"{where} did not answer in time (after iteration {iteration}): {err}"
                ) from err
            except base.TransportError as err:
                raise PSGone(f"{where}: {err}") from err
    finally:
        if conn is not None:
            conn.close()
        transport.close()
    return {
        "event": "worker_done",
        "index": cfg.index,
        "pushes": pushed,
        "last_iteration": iteration,
    }


def _left(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.0)
