"""All-reduce role (syncMode allreduce): PyTorch DDP over Gloo, no parameter server.

The baseline a PyTorch user would otherwise pick for CPU training. Every worker is
one rank (its index) of a torch.distributed group that meets at worker-0's address
on the job's links (``cfg.ps_host:cfg.ps_port``, a TCPStore rank 0 serves); each
rank's Gloo device is bound to the interface holding its pod's own address there,
so the ring's TCP connections cross the job's links, buffers, random loss and
background load exactly as a PS's would.

An iteration on every rank: the gradient of its next minibatch (the same shard and
the same minibatch order as a PS worker of the same index), DDP's all-reduce of it
(Gloo, in DDP's buckets, averaged over the ranks), one SGD step. Arithmetically a
bsp PS step: the mean of the workers' gradients times the learning rate.

Rank 0 evaluates at every epoch boundary (the PS's iterations per epoch and its
evaluation), writes epochs.csv and emits the PS's events (start, epoch, done), so a
runtime follows it as it follows ps-0; a broadcast at each boundary tells the other
ranks whether to go on. Every rank writes ``allreduce-worker-<i>.csv``::

    step, compute_ms, allreduce_ms, iteration_ms, buckets

``allreduce_ms`` runs from DDP handing its first bucket to Gloo to the last one's
completion (a DDP communication hook stamps both), ``compute_ms`` is the rest of the
forward and backward pass, ``iteration_ms`` the whole step including the update.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn

import numpy as np

from tailcut import errors
from tailcut.ml import data, models, torchmodel
from tailcut.training import exits, ps, records, worker
from tailcut.training.config import RoleConfig
from tailcut.transports import interfaces

Emit = Callable[[dict[str, Any]], None]
FIELDS = ("step", "compute_ms", "allreduce_ms", "iteration_ms", "buckets")
TEARDOWN_S = 10.0   # the longest destroy_process_group may take before the role just ends


def filename(index: int) -> str:
    return f"allreduce-worker-{index}.csv"


def interface_of(peer: str) -> tuple[str, str]:
    """(interface, address) this namespace reaches ``peer`` from: Gloo must bind the
    job's interface, not whatever the host name resolves to."""
    name, address = interfaces.toward(peer)
    if name is None:
        raise errors.RunError(f"no interface holds {address}, the address toward {peer}")
    return name, address


class _Timer:
    """The DDP communication hook: all-reduce each bucket (mean), stamping its span."""

    def __init__(self, dist: Any, world: int) -> None:
        self.dist, self.world = dist, world
        self.spans: list[tuple[float, float]] = []

    def hook(self, _state: Any, bucket: Any) -> Any:
        started = time.perf_counter()
        tensor = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
        tensor.div_(self.world)
        future = self.dist.all_reduce(tensor, async_op=True).get_future()

        def finished(fut: Any) -> Any:
            self.spans.append((started, time.perf_counter()))
            return fut.value()[0]
        return future.then(finished)

    def take(self) -> tuple[float, int]:
        """The last iteration's all-reduce span (s) and bucket count; resets."""
        spans, self.spans = self.spans, []
        if not spans:
            return 0.0, 0
        return max(e for _, e in spans) - min(s for s, _ in spans), len(spans)


def run(cfg: RoleConfig, emit: Emit) -> dict[str, Any]:
    """Train as rank ``cfg.index`` to the end; rank 0 emits the job's events and returns
    its "done" event, the others their "worker_done"."""
    torch = torchmodel.require()
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    results = Path(cfg.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    dataset, model, x, y, batches, ipe = rank_inputs(cfg)
    if not isinstance(model, torchmodel.TorchModel):
        raise errors.RunError(f"model={cfg.model!r}: allreduce needs a torch model")
    rank, world = cfg.index, cfg.num_workers
    ifname, address = interface_of(cfg.ps_host)
    os.environ["GLOO_SOCKET_IFNAME"] = ifname
    timeout = datetime.timedelta(seconds=cfg.timeout_s + worker.GRACE_S)
    dist.init_process_group("gloo", init_method=f"tcp://{cfg.ps_host}:{cfg.ps_port}",
                            rank=rank, world_size=world, timeout=timeout)
    finished = False
    try:
        ddp = DistributedDataParallel(model.module)
        timer = _Timer(dist, world)
        # A lambda: DDP refuses a hook whose parameters are annotated other than its way.
        ddp.register_comm_hook(None, lambda state, bucket: timer.hook(state, bucket))
        optimizer = torch.optim.SGD(model.module.parameters(), lr=cfg.learning_rate)
        if rank == 0:
            emit({"event": "start", "num_params": model.num_params,
                  "iterations_per_epoch": ipe, "model": cfg.model, "sync_mode": "allreduce",
                  "workers": world, "interface": ifname, "address": address})
        deadline = time.monotonic() + cfg.timeout_s
        started = time.monotonic()
        epoch, step, stop_reason, last_eval = 0, 0, "", (float("nan"), float("nan"))
        with records.CsvLog(results / filename(rank), FIELDS) as log, \
                EpochLog(results, rank) as epochs:
            while True:
                rows = next(batches)
                t0 = time.perf_counter()
                ddp.train()
                optimizer.zero_grad(set_to_none=True)
                loss = model.loss(ddp(torchmodel.to_tensor(x[rows])),
                                  torchmodel.to_tensor(y[rows]))
                loss.backward()   # DDP all-reduces the buckets as they fill
                optimizer.step()
                t1 = time.perf_counter()
                reduce_s, buckets = timer.take()
                step += 1
                log.write({"step": step - 1,
                           "compute_ms": round((t1 - t0 - reduce_s) * 1e3, 3),
                           "allreduce_ms": round(reduce_s * 1e3, 3),
                           "iteration_ms": round((t1 - t0) * 1e3, 3), "buckets": buckets})
                at_max = cfg.max_iterations is not None and step >= cfg.max_iterations
                if not verdict_due(step, ipe, at_max):
                    continue
                stop = torch.zeros(1, dtype=torch.int64)
                if rank == 0:
                    if step % ipe == 0:
                        epoch += 1
                        last_eval = epochs.evaluate(model, torchmodel.to_numpy(model.flat),
                                                    dataset, epoch, step,
                                                    time.monotonic() - started, emit)
                    stop_reason = verdict(cfg, epoch, last_eval[1], at_max, deadline)
                    stop[0] = 1 if stop_reason else 0
                dist.broadcast(stop, src=0)
                if int(stop.item()):
                    break
        jct_s = time.monotonic() - started
        dist.barrier()   # every rank is done with the group before rank 0's store goes
        finished = True
    except RuntimeError as err:
        if not peer_gone(err):
            raise
        # No teardown: with a peer gone Gloo's own threads were seen to abort the
        # process (an uncaught gloo::IoException) while the group was destroyed.
        _end(cfg, emit, False, worker.PSGone(
            f"another rank went away or stopped answering (Gloo: {err})"))
    finally:
        # torch 1.13's store client was seen spinning forever once rank 0 (which serves
        # the store) had gone: the results are written, so a stuck teardown just ends.
        guard = threading.Timer(TEARDOWN_S, _end, args=(cfg, emit, finished, None))
        guard.daemon = True
        guard.start()
        dist.destroy_process_group()
        guard.cancel()
    return closing_event(cfg, model, torchmodel.to_numpy(model.flat), dataset, epoch, step,
                         stop_reason, jct_s, last_eval)


# What Gloo's TCP pairs say when the rank at the other end died or went silent.
_PEER_LOST = ("closed by peer", "reset by peer", "Broken pipe", "Timed out")


def peer_gone(err: RuntimeError) -> bool:
    """Whether Gloo raised ``err`` because a connection to another rank broke or timed
    out, not for a mistake of this rank's (its size checks, its own memory)."""
    text = str(err)
    return "gloo/transport" in text and any(lost in text for lost in _PEER_LOST)


def _end(cfg: RoleConfig, emit: Emit, finished: bool, gone: worker.PSGone | None) -> NoReturn:
    """End the process now, without Gloo's teardown. A rank that lost a peer first says
    so, as role.py would have (the results files are closed already)."""
    if gone is not None:
        exits.say_failed(emit, cfg.role, cfg.index, str(gone))
    os._exit(exits.OK if finished else exits.PEER_GONE if gone else exits.FAILED)


def rank_inputs(cfg: RoleConfig) -> tuple[data.Dataset, models.Model, np.ndarray, np.ndarray,
                                          Iterator[np.ndarray], int]:
    """(dataset, model, the rank's shard x and y, its minibatches, iterations per
    epoch): a PS worker's of the same index, so a rank trains on what it would."""
    dataset = models.dataset(cfg.model, cfg.seed)
    model = models.create(cfg.model, dataset)
    x, y = data.shard(dataset.x_train, dataset.y_train, cfg.index, cfg.num_workers)
    batches = worker.minibatches(len(x), cfg.batch_size,
                                 np.random.default_rng([cfg.seed, 1 + cfg.index]))
    ipe = ps.iterations_per_epoch(len(dataset.x_train), cfg.batch_size, cfg.num_workers)
    return dataset, model, x, y, batches, ipe


def closing_event(cfg: RoleConfig, model: models.Model, params: np.ndarray,
                  dataset: data.Dataset, epoch: int, step: int, stop_reason: str,
                  jct_s: float, last_eval: tuple[float, float],
                  **extra: Any) -> dict[str, Any]:
    """Rank 0's "done" event (the PS's fields, and ``extra``), the others'
    "worker_done"."""
    if cfg.index != 0:
        return {"event": "worker_done", "index": cfg.index, "last_iteration": step - 1}
    if last_eval[1] != last_eval[1]:   # stopped between epochs: evaluate the end
        last_eval = model.evaluate(params, dataset.x_test, dataset.y_test)
    target = cfg.target_accuracy
    return {"event": "done", "role": "worker-0", "sync_mode": "allreduce", **extra,
            "converged": bool(target is not None and last_eval[1] >= target),
            "stop_reason": stop_reason, "epochs": epoch, "iterations": step,
            "updates": step, "jct_s": round(jct_s, 3),
            "final_accuracy": round(last_eval[1], 6), "final_loss": round(last_eval[0], 6)}


# Rank 0 gives its verdict (go on or stop) at each epoch's end, at max_iterations and
# every VERDICT_EVERY iterations: so a job past its timeoutS stops within that many
# iterations, not at an epoch's end that may come minutes later (past `tailcut run`'s
# own limit, timeoutS + 30 s). Each costs a broadcast of one integer (Gloo) or a control
# frame per rank (transpose), and a wait for rank 0.
VERDICT_EVERY = 10


def verdict_due(step: int, iterations_per_epoch: int, at_max: bool) -> bool:
    """Whether rank 0 gives its verdict after ``step`` iterations (every rank asks)."""
    return at_max or step % iterations_per_epoch == 0 or step % VERDICT_EVERY == 0


def verdict(cfg: RoleConfig, epoch: int, accuracy: float, at_max: bool,
             deadline: float) -> str:
    """Why to stop now (the PS's reasons, in its order), or "" to go on."""
    if cfg.target_accuracy is not None and accuracy >= cfg.target_accuracy:
        return "target_accuracy"
    if epoch >= cfg.max_epochs:
        return "max_epochs"
    if at_max:
        return "max_iterations"
    if time.monotonic() >= deadline:
        return "timeout"
    return ""


class EpochLog:
    """Rank 0's epochs.csv and epoch events, the PS's (records.EPOCH_FIELDS)."""

    def __init__(self, results: Path, rank: int) -> None:
        self.log = (records.CsvLog(results / "epochs.csv", records.EPOCH_FIELDS)
                    if rank == 0 else None)

    def __enter__(self) -> EpochLog:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.log is not None:
            self.log.close()

    def evaluate(self, model: models.Model, params: np.ndarray, dataset: data.Dataset,
                 epoch: int, step: int, elapsed_s: float, emit: Emit) -> tuple[float, float]:
        assert self.log is not None
        train_loss, _ = model.evaluate(params, dataset.x_train[:ps.TRAIN_EVAL_ROWS],
                                       dataset.y_train[:ps.TRAIN_EVAL_ROWS])
        test = model.evaluate(params, dataset.x_test, dataset.y_test)
        row = {"epoch": epoch, "iteration": step, "train_loss": round(train_loss, 6),
               "test_loss": round(test[0], 6), "test_accuracy": round(test[1], 6),
               "elapsed_s": round(elapsed_s, 3)}
        self.log.write(row)
        self.log.flush()
        emit({"event": "epoch", **row})
        return test
