"""Tests of the loss-tolerance sweep: loss rates, x1 and x2, the JCT model, table rows."""

import math

import pytest

from tailcut.training import emulate, sweep


def _run(epochs: int, converged: bool = True) -> emulate.Run:
    return emulate.Run(converged=converged, epochs=epochs, iterations=10 * epochs,
                       final_accuracy=0.9 if converged else 0.5, compute_s=0.01, eval_s=0.1)


def _result(epochs_by_rate: dict[float, list[int | None]]) -> sweep.Result:
    """A sweep whose runs took the given epochs (None: did not converge)."""
    result = sweep.Result("mf", emulate.LossModel(), num_workers=4, bandwidth_bps=1e9)
    for loss_rate, epochs in epochs_by_rate.items():
        runs = [_run(e) if e is not None else _run(30, converged=False) for e in epochs]
        median = sorted(e if e is not None else math.inf for e in epochs)[len(epochs) // 2]
        result.points.append(sweep.Point(loss_rate, runs, median))
    sweep._set_jcts(result, num_params=1000)
    return result


def test_loss_rates_step_from_zero_to_the_max_inclusive() -> None:
    assert sweep.loss_rates(0.05, 0.2) == [0.0, 0.05, 0.1, 0.15, 0.2]
    assert sweep.loss_rates(0.3, 0.95) == [0.0, 0.3, 0.6, 0.9]
    with pytest.raises(ValueError, match="step=0"):
        sweep.loss_rates(0, 0.5)


def test_x1_is_the_last_loss_rate_before_epochs_grow_and_x2_the_last_that_converges() -> None:
    result = _result({0.0: [5, 5, 6], 0.05: [5, 4, 5], 0.1: [6, 6, 5], 0.15: [5, 5, 5],
                      0.2: [8, 9, None], 0.25: [None, None, 9]})
    # 0.15 is back at 5 epochs, but 0.1 already needed more: x1 stops at 0.05.
    assert (result.baseline_epochs, result.x1, result.x2) == (5, 0.05, 0.2)
    # Against the slowest baseline run (6 epochs), 0.1 and 0.15 are within noise.
    assert result.x1_spread == 0.15


def test_a_model_that_never_converges_has_neither_bound() -> None:
    result = _result({0.0: [None, None, 3]})
    assert math.isinf(result.baseline_epochs)
    assert (result.x1, result.x2) == (None, None)


def test_modelled_jct_follows_eq_1_with_the_delivered_share_on_the_network() -> None:
    # 1000 floats x 4 workers x 32 bit at 1 Gbit/s = 128 us per direction at loss rate 0.
    assert sweep.network_s(1000, 4, 0.0, 1e9) == pytest.approx(128e-6)
    assert sweep.network_s(1000, 4, 0.25, 1e9) == pytest.approx(96e-6)
    run = _run(5)  # 50 iterations
    assert sweep.modelled_jct(run, 0.01, 0.1, 128e-6) == pytest.approx(
        50 * (0.01 + 2 * 128e-6) + 5 * 0.1)
    result = _result({0.0: [5], 0.1: [5], 0.2: [7]})
    jct = [pt.jct_s for pt in result.points]
    assert jct[1] < jct[0] < jct[2]  # same epochs and less to wait for; then more epochs


def test_rows_and_table_show_x1_x2_and_the_papers_bound_beside_ours() -> None:
    result = _result({0.0: [5, 5, 5], 0.05: [5, 5, 6], 0.1: [7, None, None]})
    rows = sweep.point_rows(result)
    assert [r["loss_rate"] for r in rows] == [0.0, 0.05, 0.1]
    assert rows[2]["median_epochs"] == "inf" and rows[2]["epochs_per_run"] == "7 >30 >30"
    assert set(rows[0]) == set(sweep.POINT_FIELDS)
    line = sweep.table_row(result)
    assert set(line) == set(sweep.TABLE_FIELDS)
    assert (line["x1"], line["x2"], line["paper_x1"]) == (0.05, 0.05, 0.35)
    assert line["x1_spread"] == 0.05 and line["first_failure_loss_rate"] == 0.1
    assert math.isinf(result.points[2].jct_s)  # one run of three converged: no JCT
    unbounded = sweep.table_row(_result({0.0: [5], 0.05: [5]}))
    assert unbounded["first_failure_loss_rate"] == ""
    assert sweep.format_table([unbounded]).splitlines()[1].split()[3] == ">=0.05"
    text = sweep.format_table([line])
    assert text.splitlines()[1].split()[:4] == ["mf", "0.05", "0.05", "0.05"]


def test_a_real_sweep_stops_at_the_first_loss_rate_that_does_not_converge() -> None:
    # An epoch limit of the baseline's epochs makes any slowdown a failure.
    baseline = emulate.train("mf", emulate.LossModel(0.0)).epochs
    result = sweep.sweep("mf", step=0.45, max_loss_rate=0.9, runs=1, max_epochs=baseline, jobs=1)
    assert [pt.loss_rate for pt in result.points][:1] == [0.0]
    assert all(pt.converged for pt in result.points[:-1])
    assert result.points[-1].converged == (result.points[-1].loss_rate == 0.9)
    assert result.baseline_epochs == baseline


def test_the_sweep_runs_and_reports_the_aggregation_rule_it_was_given(monkeypatch) -> None:
    seen = []

    def fake_train(name, loss, **kw):
        seen.append(kw["aggregation"])
        return emulate.Run(converged=True, epochs=3, iterations=30, final_accuracy=0.9,
                           compute_s=0.01, eval_s=0.01)

    monkeypatch.setattr(emulate, "train", fake_train)
    result = sweep.sweep("mf", step=0.5, max_loss_rate=0.5, runs=2, jobs=1, aggregation="unbiased")
    assert seen == ["unbiased"] * 4  # two loss rates, two seeds each
    assert sweep.table_row(result)["aggregation"] == "unbiased"
    with pytest.raises(ValueError, match="aggregation='sum'"):
        sweep.sweep("mf", aggregation="sum", jobs=1)
