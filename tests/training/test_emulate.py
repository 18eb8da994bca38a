"""Tests of emulated-loss BSP training: which values a loss model drops, and what a loss does."""

import numpy as np
import pytest

from tailcut.ml import models
from tailcut.training import emulate
from tailcut.transports.base import Kind


def test_packet_loss_drops_whole_ranges_of_consecutive_floats() -> None:
    loss = emulate.LossModel(0.5, "packet", range_bytes=1400)
    mask = loss.mask(10_000, np.random.default_rng(0))
    assert mask is not None and mask.shape == (10_000,)
    ranges = np.split(mask, np.arange(350, 10_000, 350))
    assert all(r.all() or not r.any() for r in ranges)  # each range: all kept or all lost
    assert 0 < sum(not r.any() for r in ranges) < len(ranges)


def test_coordinate_loss_drops_floats_independently_at_rate_p() -> None:
    mask = emulate.LossModel(0.2, "coordinate").mask(200_000, np.random.default_rng(0))
    assert mask is not None
    assert 1 - mask.mean() == pytest.approx(0.2, abs=0.005)
    # Independent: neighbours are lost together only as often as chance says.
    both_lost = np.mean(~mask[1:] & ~mask[:-1])
    assert both_lost == pytest.approx(0.04, abs=0.005)


def test_no_loss_makes_no_mask_and_directions_choose_the_messages() -> None:
    assert emulate.LossModel(0.0).mask(100, np.random.default_rng(0)) is None
    push = emulate.LossModel(0.1, direction="push")
    assert push.lossy(Kind.PUSH) and not push.lossy(Kind.PARAMS)
    pull = emulate.LossModel(0.1, direction="pull")
    assert pull.lossy(Kind.PARAMS) and not pull.lossy(Kind.PUSH)


@pytest.mark.parametrize("kwargs, words", [
    ({"loss_rate": 1.5}, "loss_rate=1.5"),
    ({"granularity": "byte"}, "granularity='byte'"),
    ({"direction": "sideways"}, "direction='sideways'"),
    ({"range_bytes": 1401}, "range_bytes=1401"),
])
def test_bad_loss_settings_are_refused_naming_the_field(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        emulate.LossModel(**kwargs)


def _initial_accuracy(name: str) -> float:
    ds = models.dataset(name, 0)
    model = models.create(name, ds)
    return model.evaluate(model.init_params(np.random.default_rng(0)), ds.x_test, ds.y_test)[1]


def test_losing_every_push_leaves_the_model_where_it_started() -> None:
    run = emulate.train("mf", emulate.LossModel(1.0, direction="push"), max_epochs=1)
    assert run.delivered == pytest.approx(0.5)  # pulls all arrived, pushes none
    assert run.final_accuracy == _initial_accuracy("mf") and not run.converged


def test_losing_every_pull_still_trains_on_gradients_taken_at_the_initial_parameters() -> None:
    run = emulate.train("mf", emulate.LossModel(1.0, direction="pull"), max_epochs=1)
    assert run.delivered == pytest.approx(0.5)
    assert run.final_accuracy != _initial_accuracy("mf")


def test_moderate_packet_loss_on_both_directions_still_converges_and_counts_what_arrived() -> None:
    run = emulate.train("mf", emulate.LossModel(0.2))
    assert run.converged and run.epochs <= models.info("mf").max_epochs
    assert run.delivered == pytest.approx(0.8, abs=0.02)
    assert run.compute_s > 0 and run.eval_s > 0 and len(run.accuracy_per_epoch) == run.epochs


def test_without_loss_the_aggregation_rule_changes_nothing() -> None:
    runs = [emulate.train("mf", emulate.LossModel(0.0), max_epochs=2, aggregation=rule)
            for rule in ("mean", "unbiased")]
    assert runs[0].accuracy_per_epoch == runs[1].accuracy_per_epoch


def test_at_heavy_push_loss_the_unbiased_rule_keeps_the_step_the_mean_rule_shrinks() -> None:
    # Two workers, 90% of each push lost: the mean rule steps on a coordinate only when
    # one of them delivered it, 19% of the time; unbiased weighting keeps the step's
    # expectation, so the MLP gets much further in one epoch.
    loss = emulate.LossModel(0.9, direction="push")
    mean, unbiased = (emulate.train("mlp", loss, num_workers=2, max_epochs=1, aggregation=rule)
                      for rule in ("mean", "unbiased"))
    assert unbiased.final_accuracy > mean.final_accuracy + 0.2


def test_an_unknown_aggregation_rule_is_refused_before_training() -> None:
    with pytest.raises(ValueError, match="aggregation='sum'"):
        emulate.train("mf", emulate.LossModel(0.0), aggregation="sum")
