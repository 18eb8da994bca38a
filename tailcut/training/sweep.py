"""Loss-tolerance sweep: emulated BSP training at loss rates 0, step, 2*step, ... to failure.

``loss_rate`` here is the fraction of values lost (the APNet'19 paper's p), not the
bounded-loss transport's ``p`` (the fraction delivered): a loss rate x is ``p = 1 - x``.

For each model and loss rate, ``runs`` emulated jobs (seeds 0..runs-1, each as
``tailcut run`` with that seed would train) give the median number of epochs to
the model's target; a run that misses the target within ``max_epochs`` counts as
infinitely many, so the median is finite only when most runs converge. From the
medians, as the APNet'19 paper defines them (its Sec. 2.2 and Table 3, in which the
loss rate is p):

- x1, the loss tolerance bound: the largest loss rate (the paper's p) such that
  every loss rate up to it needs no more epochs than loss rate 0;
- x2: the largest loss rate such that every loss rate up to it still converges to
  the target.

Epochs are whole numbers and differ between seeds even without loss (a CNN run
may take 7 epochs with one seed and 8 with another), so x1 can stop at a loss rate
whose median is one epoch above the baseline's by chance. ``x1_spread`` is the
same bound measured against the slowest baseline run instead of the median
(largest loss rate such that every loss rate up to it needs no more epochs than
some loss-rate-0 run did); the table shows both.

The sweep stops at the first loss rate that does not converge (or at ``max_loss_rate``, the
highest loss rate tried, the command's ``--max-loss-rate``). Runs are
independent, so they go to a pool of ``jobs`` processes (one per core by default),
and the runs of the next loss rate start while the current ones finish; a
speculative run past the stopping point is discarded.

JCT is modelled with the paper's Eq. (1), ``epochs x (compute + 2 x network)``
per iteration, summed over the iterations of those epochs, plus the PS's
evaluation per epoch. Compute is measured in the emulation (the slowest worker's
gradient plus the PS's averaging step; one evaluation) and taken as the median
over every run of the model's sweep, so that CPU contention during one run does
not move that run's JCT: the same model computes the same at every loss rate.
Network is the time the PS's link (``bandwidth_bps``) needs to carry one message per
worker, of which a bounded-loss transport only waits for the delivered share
(1 - loss_rate). It counts bytes only: no queueing, no retransmission tails, which
are what ``tailcut run`` measures.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field

from tailcut import papers
from tailcut.ml import data, models
from tailcut.training import aggregation as rules
from tailcut.training import emulate

Progress = Callable[[str], None]


@dataclass
class Point:
    """All runs at one loss rate (the fraction lost)."""

    loss_rate: float
    runs: list[emulate.Run]
    median_epochs: float  # math.inf when most runs did not converge
    jct_s: float = math.inf  # modelled (Eq. 1), median over the converged runs; inf if none

    @property
    def converged_runs(self) -> int:
        return sum(r.converged for r in self.runs)

    @property
    def converged(self) -> bool:
        return math.isfinite(self.median_epochs)


@dataclass
class Result:
    """One model's sweep."""

    model: str
    loss: emulate.LossModel
    num_workers: int
    bandwidth_bps: float
    points: list[Point] = field(default_factory=list)
    aggregation: str = "mean"  # the PS's rule (spec.training.aggregation)

    @property
    def baseline_epochs(self) -> float:
        return self.points[0].median_epochs

    @property
    def x1(self) -> float | None:
        """Largest loss rate such that every loss rate up to it needs no more epochs than
        loss rate 0."""
        best = None
        if not self.points or not self.points[0].converged:
            return None  # no baseline to compare with
        for point in self.points:
            if point.median_epochs > self.baseline_epochs:
                break
            best = point.loss_rate
        return best

    @property
    def x1_spread(self) -> float | None:
        """Largest loss rate such that every loss rate up to it needs no more epochs than
        the slowest loss-rate-0 run."""
        if not self.points or not self.points[0].converged:
            return None
        slowest = max(r.epochs for r in self.points[0].runs if r.converged)
        best = None
        for point in self.points:
            if point.median_epochs > slowest:
                break
            best = point.loss_rate
        return best

    @property
    def x2(self) -> float | None:
        """Largest loss rate such that every loss rate up to it still converges to the
        target."""
        best = None
        for point in self.points:
            if not point.converged:
                break
            best = point.loss_rate
        return best


def loss_rates(step: float, max_loss_rate: float) -> list[float]:
    """Loss rates 0, step, 2*step, ... up to max_loss_rate, rounded so 0.15 prints as
    0.15."""
    if not 0.0 < step <= 1.0:
        raise ValueError(f"step={step}: must be in (0, 1]")
    if not 0.0 <= max_loss_rate <= 1.0:
        raise ValueError(f"max_loss_rate={max_loss_rate}: must be in [0, 1]")
    count = int(math.floor(max_loss_rate / step + 1e-9))
    return [round(i * step, 6) for i in range(count + 1)]


def network_s(num_params: int, num_workers: int, loss_rate: float,
              bandwidth_bps: float) -> float:
    """One direction of one iteration: every worker's message through the PS's link,
    of which the receiver waits for the delivered share 1 - loss_rate."""
    return num_workers * num_params * 4 * 8 * (1.0 - loss_rate) / bandwidth_bps


def modelled_jct(run: emulate.Run, compute_s: float, eval_s: float, network_s: float) -> float:
    """Eq. (1) of the paper: iterations x (compute + 2 x network), plus evaluations."""
    return run.iterations * (compute_s + 2 * network_s) + run.epochs * eval_s


def _set_jcts(result: Result, num_params: int) -> None:
    """Fill every point's modelled JCT from the sweep-wide median compute and eval time."""
    runs = [r for pt in result.points for r in pt.runs]
    compute = statistics.median(r.compute_s for r in runs)
    evaluation = statistics.median(r.eval_s for r in runs)
    for pt in result.points:
        net = network_s(num_params, result.num_workers, pt.loss_rate, result.bandwidth_bps)
        jcts = [modelled_jct(r, compute, evaluation, net) for r in pt.runs if r.converged]
        # A loss rate whose median run failed has no JCT, even if one run made it.
        pt.jct_s = statistics.median(jcts) if jcts and pt.converged else math.inf


def sweep(
    name: str,
    *,
    loss: emulate.LossModel | None = None,
    step: float = 0.05,
    max_loss_rate: float = 0.95,
    runs: int = 3,
    num_workers: int = 4,
    max_epochs: int | None = None,
    bandwidth_bps: float = 1e9,
    jobs: int | None = None,
    progress: Progress | None = None,
    aggregation: str = "mean",
) -> Result:
    """Sweep model ``name`` at loss rates 0, ``step``, ... up to ``max_loss_rate`` (``loss``
    gives granularity/direction; its loss_rate is ignored) with the PS combining what
    arrived by ``aggregation``."""
    if runs < 1:
        raise ValueError(f"runs={runs}: need at least 1")
    if num_workers < 1:
        raise ValueError(f"num_workers={num_workers}: need at least 1")
    if bandwidth_bps <= 0:
        raise ValueError(f"bandwidth_bps={bandwidth_bps}: must be > 0")
    rules.check(aggregation)
    template = loss or emulate.LossModel()
    rates = loss_rates(step, max_loss_rate)
    num_params = models.create(name, models.dataset(name, 0)).num_params
    result = Result(name, template, num_workers, bandwidth_bps, aggregation=aggregation)
    jobs = jobs or os.cpu_count() or 1

    def submit(pool: futures.Executor,
               loss_rate: float) -> list[futures.Future[emulate.Run]]:
        at_rate = emulate.LossModel(loss_rate, template.granularity, template.direction,
                                    template.range_bytes)
        return [pool.submit(_one_run, name, at_rate, seed, num_workers, max_epochs,
                            aggregation)
                for seed in range(runs)]

    with _pool(jobs) as pool:
        pending = submit(pool, rates[0])
        for i, loss_rate in enumerate(rates):
            ahead = submit(pool, rates[i + 1]) if i + 1 < len(rates) else []
            done = [f.result() for f in pending]
            pending = ahead
            epochs = statistics.median(r.epochs if r.converged else math.inf for r in done)
            point = Point(loss_rate, done, epochs)
            result.points.append(point)
            if progress:
                accuracy = statistics.median(r.final_accuracy for r in done)
                # "p=": the loss rate, as the paper's p (tests/test_cli.py reads this line)
                progress(f"{name} loss_rate={loss_rate:.2f}: {point.converged_runs}/{runs} converged, "
                         f"median epochs {_show(epochs)}, median final accuracy "
                         f"{accuracy:.3f}, emulated in {sum(r.wall_s for r in done):.1f} s")
            if not point.converged:
                break
        for f in pending:
            f.cancel()
    _set_jcts(result, num_params)
    return result


class _InProcess(futures.Executor):
    """An executor that runs each call at once, in this process (jobs=1: no pickling)."""

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        future: futures.Future[object] = futures.Future()
        future.set_result(fn(*args, **kwargs))
        return future


def _pool(jobs: int) -> futures.Executor:
    return _InProcess() if jobs == 1 else futures.ProcessPoolExecutor(jobs)


# Per process: every run of a model with the same seed trains on the same data,
# so each pool process generates a dataset once instead of receiving it pickled.
_DATASETS: dict[tuple[str, int], data.Dataset] = {}


def _one_run(name: str, loss: emulate.LossModel, seed: int, num_workers: int,
             max_epochs: int | None, aggregation: str = "mean") -> emulate.Run:
    key = (name, seed)
    if key not in _DATASETS:
        _DATASETS[key] = models.dataset(name, seed)
    return emulate.train(name, loss, seed=seed, num_workers=num_workers,
                         max_epochs=max_epochs, dataset=_DATASETS[key],
                         aggregation=aggregation)


def _show(value: float) -> str:
    return "-" if math.isinf(value) else f"{value:g}" if value == int(value) else f"{value:.2f}"


def paper_bound(model: str, bound: str) -> float | str:
    """The APNet'19 paper's x1 (its Table 3) or x2 (where its Fig. 2 text gives one) for
    the table printed beside ours; "" where it prints none. Its models are bigger and
    trained on real data; see docs/models-and-sweeps.md for why numbers differ."""
    where = "table3" if bound == "x1" else "fig2"
    value = papers.number("apnet19", f"{where}.{model}.{bound}")
    return "" if value is None else value


POINT_FIELDS = (
    "model", "loss_rate", "runs", "converged_runs", "median_epochs", "epochs_per_run",
    "median_final_accuracy", "modelled_jct_s", "delivered", "compute_ms", "emulation_s",
)
TABLE_FIELDS = (
    "model", "x1", "x1_spread", "x2", "baseline_epochs", "baseline_jct_s", "jct_at_x1_s",
    "paper_x1", "paper_x2", "first_failure_loss_rate", "granularity", "direction",
    "range_bytes", "workers", "runs", "aggregation",
)


def point_rows(result: Result) -> list[dict[str, object]]:
    """One CSV row per loss rate (sweep.csv)."""
    rows = []
    for pt in result.points:
        rows.append({
            "model": result.model,
            "loss_rate": pt.loss_rate,
            "runs": len(pt.runs),
            "converged_runs": pt.converged_runs,
            "median_epochs": _num(pt.median_epochs),
            "epochs_per_run": " ".join(
                str(r.epochs) if r.converged else f">{r.epochs}" for r in pt.runs),
            "median_final_accuracy": round(statistics.median(r.final_accuracy for r in pt.runs), 4),
            "modelled_jct_s": _num(pt.jct_s, 3),
            "delivered": round(statistics.mean(r.delivered for r in pt.runs), 4),
            "compute_ms": round(1e3 * statistics.median(r.compute_s for r in pt.runs), 3),
            "emulation_s": round(sum(r.wall_s for r in pt.runs), 2),
        })
    return rows


def table_row(result: Result) -> dict[str, object]:
    """The model's line of the Table-3-like summary (table3.csv)."""
    by_rate = {pt.loss_rate: pt for pt in result.points}
    x1 = result.x1
    return {
        "model": result.model,
        "x1": "" if x1 is None else x1,
        "x1_spread": "" if result.x1_spread is None else result.x1_spread,
        "x2": "" if result.x2 is None else result.x2,
        "baseline_epochs": _num(result.baseline_epochs),
        "baseline_jct_s": _num(result.points[0].jct_s, 3),
        "jct_at_x1_s": "" if x1 is None else _num(by_rate[x1].jct_s, 3),
        "paper_x1": paper_bound(result.model, "x1"),
        "paper_x2": paper_bound(result.model, "x2"),
        # Empty when every loss rate up to max_loss_rate converged: x2 is then only a lower bound.
        "first_failure_loss_rate": next(
            (pt.loss_rate for pt in result.points if not pt.converged), ""),
        "granularity": result.loss.granularity,
        "direction": result.loss.direction,
        "range_bytes": result.loss.range_bytes if result.loss.granularity == "packet" else "",
        "workers": result.num_workers,
        "runs": len(result.points[0].runs),
        "aggregation": result.aggregation,
    }


def format_table(rows: list[dict[str, object]]) -> str:
    """Table 3 as text: our x1 and x2 beside the paper's."""
    lines = [f"{'model':<8}{'x1':>6}{'x1*':>6}{'x2':>8}{'epochs@0':>10}{'JCT@0 s':>10}"
             f"{'JCT@x1 s':>10}{'paper x1':>10}{'paper x2':>10}"]
    for r in rows:
        bounded = r.get("first_failure_loss_rate", "") != ""
        x2 = _cell(r["x2"]) if bounded else f">={_cell(r['x2'])}"
        lines.append(f"{r['model']!s:<8}{_cell(r['x1']):>6}{_cell(r['x1_spread']):>6}"
                     f"{x2:>8}"
                     f"{_cell(r['baseline_epochs']):>10}{_cell(r['baseline_jct_s']):>10}"
                     f"{_cell(r['jct_at_x1_s']):>10}{_cell(r['paper_x1']):>10}"
                     f"{_cell(r['paper_x2']):>10}")
    lines.append("x1, x2: loss rates (the paper's p); x1* = x1 measured against the slowest "
                 "loss-rate-0 run instead of the median (epochs differ between seeds even "
                 "without loss); >=x: converged at every loss rate tried")
    return "\n".join(lines)


def _num(value: float, digits: int = 2) -> object:
    """A CSV cell: 'inf' for a run that never converged, else a rounded number."""
    return "inf" if math.isinf(value) else round(value, digits)


def _cell(value: object) -> str:
    if value == "" or value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)
