"""The plan of CadentFlow priority classes (pure; no root)."""

import pytest

from tailcut.net import shaping


def test_strict_priority_classes_get_tiny_rates_full_ceil_and_their_level_as_prio():
    classes = shaping.plan_priorities(100_000_000, 3)
    default, *levels = classes
    assert default.classid == shaping.DEFAULT_CLASS and default.prio == 7
    assert [c.classid for c in levels] == [0x10020, 0x10021, 0x10022]
    assert [c.prio for c in levels] == [0, 1, 2]
    assert all(c.ceil_bit == 100_000_000 and c.rate_bit == 100_000 for c in classes)


def test_strict_classes_bank_one_frame_so_an_idle_low_level_cannot_jump_the_queue():
    # HTB sends a class that has tokens of its own before any borrowing class
    classes = shaping.plan_priorities(10**9, 3)
    assert all(c.burst_bytes == shaping.MTU_BYTES for c in classes)
    assert all(c.cburst_bytes >= shaping.GSO_BYTES for c in classes)


def test_weights_become_class_rates_at_one_prio():
    _, a, b = shaping.plan_priorities(90_000_000, 2, weights=[2.0, 1.0])
    assert (a.rate_bit, b.rate_bit) == (60_000_000, 30_000_000)
    assert a.prio == b.prio == 0
    assert a.burst_bytes >= shaping.GSO_BYTES   # each share must reach its rate


def test_the_classifier_and_the_plan_agree_on_class_minors():
    from tailcut.datapath import classifier
    classes = shaping.plan_priorities(10**9, 4)
    assert [c.classid & 0xFFFF for c in classes[1:]] == \
        [classifier.class_minor(level) for level in range(4)]


@pytest.mark.parametrize("levels, weights, field", [
    (0, None, "levels=0"), (8, None, "levels=8"), (2, [1.0], "weights=\\[1.0\\]"),
    (2, [1.0, 0.0], "weights="),
])
def test_bad_levels_or_weights_are_refused_by_name(levels, weights, field):
    with pytest.raises(ValueError, match=field):
        shaping.plan_priorities(10**9, levels, weights)


def test_the_links_buffer_becomes_each_levels_own_leaf_and_the_default_keeps_its_own():
    classes = shaping.plan_priorities(10**9, 2, queue=shaping.Queue(8, "packets"))
    default, a, b = classes
    assert default.queue is None    # shaping.apply gave 1:10 its leaf
    assert (a.queue.parent, a.queue.handle) == (0x10020, 0x200000)
    assert (b.queue.parent, b.queue.handle) == (0x10021, 0x210000)
    assert a.queue.limit == b.queue.limit == 8
    assert shaping.describe_priorities(classes).endswith(", pfifo buffer 8 packets per class")


def test_without_a_buffer_the_levels_keep_the_kernels_default_queue():
    assert all(c.queue is None for c in shaping.plan_priorities(10**9, 3))
