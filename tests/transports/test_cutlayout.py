"""The wire layout of a CadentFlow-tagged datagram message: every cut on slot boundaries."""

import numpy as np
import pytest

from tailcut.transports import base, cutlayout, wire

STRIDE = 360
# A model-ordered message of three tensors, sent most urgent (the last one) first.
CUTS = (base.Cut(1000, 500, 0), base.Cut(0, 32, 1), base.Cut(32, 968, 2))
VALUES = np.arange(1500, dtype=np.float32)


def test_each_cut_starts_on_a_slot_and_no_slot_carries_two_cuts() -> None:
    layout = cutlayout.plan(CUTS, 1500, STRIDE)
    assert layout.wire_starts.tolist() == [0, 720, 1080]  # 500 -> 2 slots, 32 -> 1, 968 -> 3
    assert layout.total == 1080 + 968 and layout.elements == 1500
    assert layout.slot_cut.tolist() == [0, 0, 1, 2, 2, 2]
    assert layout.slot_elements.tolist() == [360, 140, 32, 360, 360, 248]
    assert layout.slot_elements.sum() == 1500
    assert wire.slots(layout.total, STRIDE) == len(layout.slot_cut)
    for i, cut in enumerate(CUTS):  # a cut's elements lie inside its own slots
        lo, hi = layout.first_slot[i], layout.first_slot[i + 1]
        assert lo * STRIDE == layout.wire_starts[i]
        assert layout.wire_starts[i] + cut.size <= hi * STRIDE


def test_the_wire_vector_holds_each_cut_in_send_order_and_maps_back() -> None:
    layout = cutlayout.plan(CUTS, 1500, STRIDE)
    on_wire = layout.to_wire(VALUES)
    assert np.array_equal(on_wire[:500], VALUES[1000:])
    assert not on_wire[500:720].any()  # padding
    assert np.array_equal(on_wire[720:752], VALUES[:32])
    mask = np.zeros(layout.total, bool)
    mask[720:752] = True
    values, got = layout.from_wire(on_wire, mask)
    assert np.array_equal(values, VALUES)
    assert got.tolist() == [True] * 32 + [False] * 1468


def test_the_cut_table_round_trips_through_the_begin_frame() -> None:
    layout = cutlayout.plan(CUTS + (base.Cut(1500, 10, None),), 1510, STRIDE)
    back = cutlayout.decode(layout.encode(), layout.total, STRIDE)
    assert back.cuts == layout.cuts and back.total == layout.total
    assert back.cuts[-1].level is None


@pytest.mark.parametrize("cuts, elements, error", [
    ((base.Cut(0, 10, 0), base.Cut(5, 10, 1)), 15, "at offset 5.*without gap or overlap"),
    ((base.Cut(0, 10, 0), base.Cut(11, 4, 1)), 15, "at offset 11"),
    ((base.Cut(0, 10, 0),), 15, "cover 10 elements; the message has 15"),
    ((base.Cut(0, 0, 0),), 0, "cut 0: offset 0, size 0"),
    ((base.Cut(0, 10, 300),), 10, "cut 0: level 300"),
    ((), 0, "0 cuts"),
])
def test_cuts_that_do_not_tile_the_message_are_refused_naming_the_cut(cuts, elements,
                                                                      error) -> None:
    with pytest.raises(ValueError, match=error):
        cutlayout.plan(cuts, elements, STRIDE)


def test_a_hostile_cut_table_is_refused_before_anything_big_is_allocated() -> None:
    entry = cutlayout.ENTRY
    huge = entry.pack(0, 0xFFFF_0000, 0) + entry.pack(0xFFFF_0000, 0xFFFF, 1)  # 4 G floats
    with pytest.raises(ValueError, match="wire elements; at most 2048"):
        cutlayout.decode(huge, 2048, STRIDE)
    with pytest.raises(ValueError, match="not whole 9-byte entries"):
        cutlayout.decode(b"\0" * 10, 2048, STRIDE)
    good = cutlayout.plan(CUTS, 1500, STRIDE)
    with pytest.raises(ValueError, match="lays out 2048 wire elements; BEGIN says 2049"):
        cutlayout.decode(good.encode(), 2049, STRIDE)
    too_many = entry.pack(0, 1, 0) * (cutlayout.MAX_CUTS + 1)
    with pytest.raises(ValueError, match="4097 cuts"):
        cutlayout.decode(too_many, 10_000, STRIDE)
