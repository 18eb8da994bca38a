"""Parameter server role for BSP SGD: where a gradient is averaged and the model updated.

One iteration: send PARAMS(i) to every worker, gather one PUSH(i) from each,
average each coordinate over the workers that delivered it, take an SGD step.
After every epoch (``ceil(n_train / (batch_size * num_workers))`` iterations) the
PS evaluates on the test set and stops when the target accuracy, max_epochs or
max_iterations is reached, or the job's timeout passes; then it sends STOP.

Progress goes to ``emit`` as events (role.py prints them as JSON lines)::

    {"event": "start", "num_params": 64714, "iterations_per_epoch": 63, ...}
    {"event": "epoch", "epoch": 1, "iteration": 63, "train_loss": ..., ...}
    {"event": "done", "converged": true, "stop_reason": "target_accuracy", ...}
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tailcut import errors, transports
from tailcut.training import models, records
from tailcut.training.config import RoleConfig
from tailcut.transports import base
from tailcut.transports.base import Kind, Message

Emit = Callable[[dict[str, Any]], None]

# The PS reports training loss on a fixed slice of the training set rather than on
# every example: evaluating 8000 rows per epoch would stall all workers longer.
TRAIN_EVAL_ROWS = 2000


def average(pushes: Sequence[Message], num_params: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-coordinate mean over the workers that delivered that coordinate.

    Returns (mean, delivered): a coordinate no worker delivered has mean 0 and
    ``delivered`` False, so an SGD step leaves that parameter as it was.
    """
    total = np.zeros(num_params, dtype=np.float32)
    counts = np.zeros(num_params, dtype=np.int32)
    for msg in pushes:
        if msg.values.shape != (num_params,):
            raise errors.RunError(
                f"worker {msg.sender} pushed {msg.values.size} values; the model has {num_params}"
            )
        if msg.mask is None:
            total += msg.values
            counts += 1
        else:
            # Missing values may hold anything (even NaN): never add them.
            total[msg.mask] += msg.values[msg.mask]
            counts += msg.mask
    delivered = counts > 0
    mean = np.zeros(num_params, dtype=np.float32)
    np.divide(total, counts, out=mean, where=delivered)
    return mean, delivered


def iterations_per_epoch(num_train: int, batch_size: int, num_workers: int) -> int:
    """Iterations for the workers together to see ``num_train`` examples once."""
    return max(math.ceil(num_train / (batch_size * num_workers)), 1)


def run(cfg: RoleConfig, emit: Emit) -> dict[str, Any]:
    """Run the PS to the end of the job; return the "done" event (also emitted)."""
    started = time.monotonic()
    deadline = started + cfg.timeout_s
    dataset = models.dataset(cfg.model, cfg.seed)
    model = models.create(cfg.model, dataset)
    x_fit, y_fit = dataset.x_train[:TRAIN_EVAL_ROWS], dataset.y_train[:TRAIN_EVAL_ROWS]
    per_epoch = iterations_per_epoch(len(dataset.x_train), cfg.batch_size, cfg.num_workers)
    options = {k: v for k, v in cfg.transport.items() if k != "type"}
    transport = transports.get(cfg.transport["type"], **options)
    results = Path(cfg.results_dir)

    conns: list[base.Connection] = []
    try:
        with (
            records.CsvLog(results / "epochs.csv", records.EPOCH_FIELDS) as epochs_log,
            records.CsvLog(
                results / records.messages_filename("ps", 0), records.MESSAGE_FIELDS
            ) as messages_log,
        ):
            conns = transport.listen(cfg.ps_host, cfg.ps_port, cfg.num_workers, _left(deadline))
            conns = _order_by_hello(transport, conns, cfg.num_workers, deadline, messages_log)
            params = model.init_params(np.random.default_rng(cfg.seed))
            emit(
                {
                    "event": "start",
                    "job": cfg.job,
                    "model": cfg.model,
                    "num_params": model.num_params,
                    "num_workers": cfg.num_workers,
                    "iterations_per_epoch": per_epoch,
                    "transport": cfg.transport["type"],
                    "setup_s": round(time.monotonic() - started, 3),
                }
            )
            train_start = time.monotonic()
            iteration = epoch = 0
            stop_reason = ""
            last_eval: tuple[float, float] | None = None
            while not stop_reason:
                try:
                    for conn in conns:
                        conn.send(
                            Message(Kind.PARAMS, iteration, base.PS_SENDER, params), _left(deadline)
                        )
                    pushes = transport.gather(conns, _left(deadline))
                except base.TransportTimeout:
                    stop_reason = "timeout"
                    break
                except base.TransportError as err:
                    raise errors.RunError(f"iteration {iteration}: {err}") from err
                for worker, msg in enumerate(pushes):
                    _expect(msg, Kind.PUSH, iteration, worker)
                    messages_log.write(records.message_row(msg, base.PS_SENDER))
                mean, _ = average(pushes, model.num_params)
                params -= np.float32(cfg.learning_rate) * mean
                iteration += 1
                last_eval = None
                if iteration % per_epoch == 0:
                    epoch += 1
                    train_loss, _ = model.evaluate(params, x_fit, y_fit)
                    last_eval = model.evaluate(params, dataset.x_test, dataset.y_test)
                    row = {
                        "epoch": epoch,
                        "iteration": iteration,
                        "train_loss": round(train_loss, 6),
                        "test_loss": round(last_eval[0], 6),
                        "test_accuracy": round(last_eval[1], 6),
                        "elapsed_s": round(time.monotonic() - train_start, 3),
                    }
                    epochs_log.write(row)
                    epochs_log.flush()
                    messages_log.flush()
                    emit({"event": "epoch", **row})
                    if cfg.target_accuracy is not None and last_eval[1] >= cfg.target_accuracy:
                        stop_reason = "target_accuracy"
                    elif epoch >= cfg.max_epochs:
                        stop_reason = "max_epochs"
                if (
                    not stop_reason
                    and cfg.max_iterations is not None
                    and iteration >= cfg.max_iterations
                ):
                    stop_reason = "max_iterations"
                if not stop_reason and time.monotonic() >= deadline:
                    stop_reason = "timeout"
            _send_stop(conns, iteration, stop_reason == "timeout")
            jct_s = time.monotonic() - train_start
            final_loss, final_accuracy = last_eval or model.evaluate(
                params, dataset.x_test, dataset.y_test
            )
    finally:
        for conn in conns:
            conn.close()
        transport.close()
    done = {
        "event": "done",
        "converged": cfg.target_accuracy is not None and final_accuracy >= cfg.target_accuracy,
        "stop_reason": stop_reason,
        "epochs": epoch,
        "iterations": iteration,
        "jct_s": round(jct_s, 3),
        "final_accuracy": round(final_accuracy, 6),
        "final_loss": round(final_loss, 6),
    }
    emit(done)
    return done


def _order_by_hello(
    transport: base.Transport,
    conns: list[base.Connection],
    num_workers: int,
    deadline: float,
    log: records.CsvLog,
) -> list[base.Connection]:
    """Read each worker's HELLO and return the connections indexed by worker."""
    hellos = transport.gather(conns, _left(deadline))
    by_index: dict[int, base.Connection] = {}
    for conn, msg in zip(conns, hellos, strict=True):
        if msg.kind != Kind.HELLO:
            raise errors.RunError(f"{conn.peer} sent {msg.kind.name} before HELLO")
        if not 0 <= msg.sender < num_workers:
            raise errors.RunError(
                f"{conn.peer} says it is worker {msg.sender}; expected 0..{num_workers - 1}"
            )
        if msg.sender in by_index:
            raise errors.RunError(
                f"two workers say they are worker {msg.sender}: "
                f"{by_index[msg.sender].peer} and {conn.peer}"
            )
        by_index[msg.sender] = conn
        conn.peer = f"worker {msg.sender} ({conn.peer})"  # errors then name the worker
        log.write(records.message_row(msg, base.PS_SENDER))
    return [by_index[i] for i in range(num_workers)]


def _expect(msg: Message, kind: Kind, iteration: int, worker: int) -> None:
    if msg.kind != kind or msg.iteration != iteration or msg.sender != worker:
        raise errors.RunError(
            f"expected {kind.name} for iteration {iteration} from worker {worker}, "
            f"got {msg.kind.name} for iteration {msg.iteration} from worker {msg.sender}"
        )


def _send_stop(conns: Sequence[base.Connection], iteration: int, best_effort: bool) -> None:
    """Tell every worker to exit; after a timeout some may be gone already."""
    for conn in conns:
        try:
            conn.send(Message(Kind.STOP, iteration, base.PS_SENDER), timeout_s=5.0)
        except base.TransportError:
            if not best_effort:
                raise


def _left(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.0)
