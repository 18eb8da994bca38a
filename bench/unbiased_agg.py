"""The PS's aggregation rules side by side under emulated loss: mean against unbiased.

    .venv/bin/python bench/unbiased_agg.py [--model mlp] [--loss 0.1] [--seeds 3]
        [--epochs 5] [--workers 4] [--granularity packet] [--direction both] [--jobs N]

For each loss rate, rule (``spec.training.aggregation``: ``mean``, the per-coordinate
average over the workers that delivered, and ``unbiased``, inverse-probability
weighting) and seed, one emulated BSP job (tailcut.training.emulate, no network)
trains ``--epochs`` epochs; the table gives, per rule, the epoch at which test
accuracy first reached the model's target (and its iterations; the emulation
evaluates once per epoch, so that is as fine as it gets) and the accuracy after the
last epoch, per seed and as medians. Same seed, same data, minibatches and loss
draws for both rules: only the PS's combination differs.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # as the roles and `tailcut sweep`: before numpy loads

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from concurrent import futures  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import hostcheck  # noqa: E402
from tailcut.ml import models  # noqa: E402
from tailcut.training import aggregation, emulate, ps  # noqa: E402

NO_TARGET = 2.0  # train every epoch: accuracy never reaches it


def _one(model: str, loss: emulate.LossModel, rule: str, seed: int, workers: int,
         epochs: int) -> emulate.Run:
    return emulate.train(model, loss, seed=seed, num_workers=workers, max_epochs=epochs,
                         target_accuracy=NO_TARGET, aggregation=rule)


def _to_target(run: emulate.Run, target: float) -> int | None:
    """First epoch whose evaluation reached ``target``; None if none did."""
    return next((e + 1 for e, a in enumerate(run.accuracy_per_epoch) if a >= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", choices=models.names())
    parser.add_argument("--loss", type=float, nargs="+", default=[0.1],
                        help="loss rates (each value of each message lost with this chance)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--granularity", choices=emulate.GRANULARITIES, default="packet")
    parser.add_argument("--direction", choices=emulate.DIRECTIONS, default="both")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    watch = hostcheck.before(args)
    entry = models.info(args.model)
    ds = models.dataset(args.model, 0)
    per_epoch = ps.iterations_per_epoch(len(ds.x_train), entry.batch_size, args.workers)
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    started = time.perf_counter()
    runs: dict[tuple[float, str], list[futures.Future[emulate.Run]]] = {}
    with futures.ProcessPoolExecutor(args.jobs) as pool:
        for loss_rate in args.loss:
            loss = emulate.LossModel(loss_rate, args.granularity, args.direction)
            for rule in aggregation.RULES:
                runs[(loss_rate, rule)] = [pool.submit(_one, args.model, loss, rule, seed,
                                               args.workers, args.epochs)
                                   for seed in range(args.seeds)]
        done = {key: [f.result() for f in fs] for key, fs in runs.items()}
    took = time.perf_counter() - started

    target = entry.target_accuracy
    print(f"\n{args.model}: {args.workers} workers, {args.granularity} loss on "
          f"{args.direction}, target accuracy {target:g}, {args.epochs} epochs of "
          f"{per_epoch} iterations, seeds 0..{args.seeds - 1}")
    print(f"{'loss':>5} {'rule':<9} {'epochs to target':<18} {'median':>6} "
          f"{'iterations':>10}  {'accuracy after last epoch':<27} {'median':>6} {'delivered':>9}")
    for (loss_rate, rule), rs in done.items():
        reached = [_to_target(r, target) for r in rs]
        epochs = [e if e is not None else float("inf") for e in reached]
        median = statistics.median(epochs)
        accuracy = [r.final_accuracy for r in rs]
        print(f"{loss_rate:>5.2f} {rule:<9} "
              f"{' '.join(str(e) if e is not None else '-' for e in reached):<18} "
              f"{_show(median):>6} {_show(median * per_epoch):>10}  "
              f"{' '.join(f'{a:.4f}' for a in accuracy):<27} "
              f"{statistics.median(accuracy):>6.4f} "
              f"{statistics.mean(r.delivered for r in rs):>9.3f}")
    print(f"\n'-': the target was not reached in {args.epochs} epochs. {len(done) * args.seeds} "
          f"runs in {took:.1f} s; load average after: {os.getloadavg()[0]:.2f}")
    hostcheck.after(watch)


def _show(value: float) -> str:
    return "-" if value == float("inf") else f"{value:g}"


if __name__ == "__main__":
    main()
