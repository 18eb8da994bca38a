"""Tags derived from a model's layers follow the paper's rules."""

from tailcut.scheduling import tags


def test_forward_deadline_is_the_compute_before_the_layer():
    assert tags.forward_deadlines_s([0.1, 0.2, 0.3]) == [0.0, 0.1, 0.30000000000000004]


def test_gradients_become_ready_in_reverse_layer_order():
    assert tags.backward_release_s([0.1, 0.2, 0.3]) == [0.6, 0.5, 0.3]


def test_earlier_layers_have_higher_priority_in_both_passes():
    assert tags.forward_priority(0) < tags.forward_priority(3)
    assert tags.backward_priority(0, 4) < tags.backward_priority(3, 4)


def _scheduling(**kw):
    from tailcut.spec.model import Scheduling
    return Scheduling(**kw)


def test_derived_tags_put_layers_in_level_buckets_and_deadlines_on_pulls():
    resolved = tags.resolve(_scheduling(policy="cadentflow", priority_levels=2),
                            ["a", "b", "c", "d"], forward_s=[0.1, 0.1, 0.1, 0.1])
    assert [resolved[(n, "pull")].priority for n in "abcd"] == [0, 0, 1, 1]
    assert resolved[("c", "pull")].deadline_s == 0.2
    assert resolved[("c", "push")].deadline_s is None


def test_hand_written_tags_override_derived_ones_per_direction():
    from tailcut.spec.model import FlowTag
    s = _scheduling(policy="cadentflow", priority_levels=4, objective="minMaxDelay",
                    flows=[FlowTag(layer="d", direction="pull", priority=0, deadline_ms=5),
                           FlowTag(layer="*", direction="push", weight=2.0)])
    resolved = tags.resolve(s, ["a", "b", "c", "d"])
    assert resolved[("d", "pull")] == tags.Tag(0, 0.005, None)
    assert resolved[("d", "push")] == tags.Tag(3, None, 2.0)


def test_a_tag_for_a_tensor_the_model_lacks_names_the_tag_and_the_tensors():
    import pytest

    from tailcut.errors import SpecError
    from tailcut.spec.model import FlowTag
    s = _scheduling(policy="cadentflow", flows=[FlowTag(layer="W9", priority=0)])
    with pytest.raises(SpecError, match=r"flows\[0\].layer='W9'.*tensors are W1, b1"):
        tags.resolve(s, ["W1", "b1"])


def test_without_derivation_only_hand_written_tags_remain():
    resolved = tags.resolve(_scheduling(derive_tags=False), ["a"])
    assert resolved[("a", "pull")] == tags.Tag()
