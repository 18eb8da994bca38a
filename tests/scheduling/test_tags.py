"""Tags derived from a model's layers follow the paper's rules."""

from tailcut.scheduling import tags


def test_forward_deadline_is_the_compute_before_the_layer():
    assert tags.forward_deadlines_s([0.1, 0.2, 0.3]) == [0.0, 0.1, 0.30000000000000004]


def test_gradients_become_ready_in_reverse_layer_order():
    assert tags.backward_release_s([0.1, 0.2, 0.3]) == [0.6, 0.5, 0.3]


def test_earlier_layers_have_higher_priority_in_both_passes():
    assert tags.forward_priority(0) < tags.forward_priority(3)
    assert tags.backward_priority(0, 4) < tags.backward_priority(3, 4)
