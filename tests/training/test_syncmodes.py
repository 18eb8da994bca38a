"""How a PS shard combines pushes and when it answers pulls, per sync mode."""

import numpy as np
import pytest

from tailcut import errors
from tailcut.training import syncmodes
from tailcut.training.config import RoleConfig
from tailcut.transports.base import Kind, Message


def _push(sender: int, values: list[float], mask: list[bool] | None = None,
          iteration: int = 0) -> Message:
    return Message(
        Kind.PUSH,
        iteration,
        sender,
        np.array(values, dtype=np.float32),
        None if mask is None else np.array(mask),
    )


def test_ps_averages_each_coordinate_over_workers_that_sent_it() -> None:
    pushes = [
        _push(0, [1.0, 2.0, 3.0], [True, True, False]),
        _push(1, [3.0, 99.0, 5.0], [True, False, True]),
        _push(2, [5.0, 4.0, 7.0]),  # no mask: everything arrived
    ]
    mean, delivered = syncmodes.average(pushes, 3)
    np.testing.assert_allclose(mean, [3.0, 3.0, 6.0])
    assert delivered.all()


def test_a_coordinate_no_worker_delivered_gets_a_zero_step_and_is_flagged() -> None:
    pushes = [_push(0, [1.0, 8.0], [True, False]), _push(1, [3.0, 9.0], [True, False])]
    mean, delivered = syncmodes.average(pushes, 2)
    np.testing.assert_array_equal(mean, [2.0, 0.0])
    np.testing.assert_array_equal(delivered, [True, False])


def test_the_unbiased_rule_divides_each_sum_by_the_workers_times_the_share_delivered() -> None:
    pushes = [
        _push(0, [1.0, 2.0, 3.0], [True, True, False]),
        _push(1, [3.0, 99.0, 5.0], [True, False, True]),
        _push(2, [5.0, 4.0, 7.0]),
    ]
    step, delivered = syncmodes.average(pushes, 3, "unbiased")
    # 7 of the 9 values arrived: sums 9, 6, 12 over 3 workers x 7/9
    np.testing.assert_allclose(step, [9 * 3 / 7, 6 * 3 / 7, 12 * 3 / 7], rtol=1e-6)
    assert delivered.all()


def test_garbage_in_missing_coordinates_never_reaches_the_average() -> None:
    pushes = [_push(0, [np.nan, 1.0], [False, True]), _push(1, [2.0, np.inf], [True, False])]
    mean, _ = syncmodes.average(pushes, 2)
    np.testing.assert_array_equal(mean, [2.0, 1.0])


def test_without_masks_the_average_is_the_plain_mean() -> None:
    rng = np.random.default_rng(0)
    grads = rng.normal(size=(4, 50)).astype(np.float32)
    mean, _ = syncmodes.average([Message(Kind.PUSH, 0, i, g) for i, g in enumerate(grads)], 50)
    np.testing.assert_allclose(mean, grads.mean(axis=0), rtol=1e-5, atol=1e-6)


def test_a_push_of_the_wrong_length_is_a_run_error_naming_the_worker() -> None:
    with pytest.raises(errors.RunError, match="worker 1 pushed 2 values; the model has 3"):
        syncmodes.average([_push(0, [1.0, 2.0, 3.0]), _push(1, [1.0, 2.0])], 3)


def _cfg(mode: str, staleness: int = 0, workers: int = 2) -> RoleConfig:
    return RoleConfig(job="j", role="ps", index=0, ps_host="127.0.0.1", ps_port=1,
                      results_dir="unused", num_workers=workers, sync_mode=mode,
                      staleness=staleness, learning_rate=0.5)


def test_bsp_steps_once_every_source_has_pushed_its_iteration_and_answers_pulls_after() -> None:
    weight = {"worker-0": 1, "worker-1": 1}
    mode = syncmodes.create(_cfg("bsp"), 2, weight)
    params = np.zeros(2, dtype=np.float32)
    assert mode.allowed("worker-0", 0, 0) and not mode.allowed("worker-0", 1, 0)
    assert mode.apply("worker-1", _push(1, [2.0, 4.0]), params, 0, 0) == (0, 0)
    np.testing.assert_array_equal(params, [0.0, 0.0])   # half the barrier: no step yet
    assert mode.apply("worker-0", _push(0, [4.0, 8.0]), params, 0, 0) == (1, 1)
    np.testing.assert_allclose(params, [-1.5, -3.0])   # 0.5 x the mean (3, 6)
    assert mode.allowed("worker-0", 1, 1)
    assert mode.ahead(_push(0, [0.0, 0.0], iteration=2), 1)


def test_bsp_refuses_a_second_push_of_one_iteration_or_one_of_another_naming_both() -> None:
    mode = syncmodes.create(_cfg("bsp"), 1, {"worker-0": 1, "worker-1": 1})
    params = np.zeros(1, dtype=np.float32)
    mode.apply("worker-0", _push(0, [1.0]), params, 0, 0)
    with pytest.raises(errors.RunError, match="expected PUSH for iteration 0 from worker 0, "
                                              "got PUSH for iteration 0"):
        mode.apply("worker-0", _push(0, [1.0]), params, 0, 0)
    with pytest.raises(errors.RunError, match="got PUSH for iteration 3"):
        mode.apply("worker-1", _push(1, [1.0], iteration=3), params, 0, 0)


def test_ssp_holds_a_pull_more_than_staleness_steps_ahead_of_the_slowest_worker() -> None:
    mode = syncmodes.create(_cfg("ssp", staleness=1), 1, {"worker-0": 1, "worker-1": 1})
    params = np.zeros(1, dtype=np.float32)
    assert mode.allowed("worker-0", 1, 0) and not mode.allowed("worker-0", 2, 0)
    # each push applies at once, at learning_rate / workers; two pushes are one iteration
    assert mode.apply("worker-0", _push(0, [2.0], iteration=0), params, 0, 0) == (0, 1)
    np.testing.assert_allclose(params, [-0.5])
    assert not mode.allowed("worker-0", 2, 0)   # worker-1 has pushed nothing yet
    assert mode.apply("worker-1", _push(1, [2.0], iteration=0), params, 0, 1) == (1, 2)
    assert mode.allowed("worker-0", 2, 1)
    assert not mode.ahead(_push(0, [0.0], iteration=9), 1)


def test_async_answers_every_pull_at_once_and_applies_only_what_a_mask_delivered() -> None:
    mode = syncmodes.create(_cfg("async"), 2, {"worker-0": 1, "worker-1": 1})
    assert mode.allowed("worker-0", 1000, 0)
    params = np.zeros(2, dtype=np.float32)
    mode.apply("worker-0", _push(0, [2.0, np.nan], [True, False]), params, 0, 0)
    np.testing.assert_allclose(params, [-0.5, 0.0])
