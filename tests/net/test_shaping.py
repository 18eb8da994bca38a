"""Shaping plans for both kinds of kernel: with netem and without."""

import pytest

from tailcut.errors import KernelFeatureMissing
from tailcut.net import shaping
from tailcut.spec.model import Link


def test_a_plain_link_gets_only_htb_at_its_rate():
    assert shaping.plan(Link(bandwidth="100Mbit"), False, "f") == [shaping.Htb(rate_bit=10**8)]


def test_loss_without_netem_falls_back_to_the_ebpf_dropper():
    ops = shaping.plan(Link(loss=0.05), has_netem=False, field="f")
    assert ops[1] == shaping.Drop(loss=0.05)


def test_loss_and_delay_with_netem_become_one_netem_leaf():
    ops = shaping.plan(Link(loss=0.01, delay_ms=5, jitter_ms=1), has_netem=True, field="f")
    assert ops[1] == shaping.Netem(delay_ms=5, jitter_ms=1, loss=0.01)
    assert len(ops) == 2


@pytest.mark.parametrize("link, field", [(Link(delay_ms=5), "spec.network.uplink.delayMs=5"),
                                         (Link(delay_ms=5, jitter_ms=1),
                                          "spec.network.uplink.delayMs=5")])
def test_delay_without_netem_is_refused_naming_field_and_kernel_feature(link, field):
    with pytest.raises(KernelFeatureMissing) as info:
        shaping.plan(link, has_netem=False, field="spec.network.uplink")
    assert field in str(info.value) and "netem" in str(info.value)


def test_htb_burst_is_one_gso_packet_and_a_frame_and_quantum_stays_below_the_kernel_warning():
    slow, fast = shaping.Htb(rate_bit=10**6), shaping.Htb(rate_bit=10**10)
    # At any rate: a bigger bucket lets a sender that was idle go faster than the link.
    assert slow.burst_bytes == fast.burst_bytes == shaping.GSO_BYTES + shaping.MTU_BYTES
    assert fast.quantum_bytes == shaping.HTB_QUANTUM_MAX
    assert slow.quantum_bytes >= shaping.MTU_BYTES


def test_describe_says_what_was_applied():
    ops = shaping.plan(Link(bandwidth="100Mbit", loss=0.05), False, "f")
    assert shaping.describe(ops) == "htb 100 Mbit/s, ebpf dropper loss 0.05"


def test_only_lossy_ops_ask_for_one_wire_packet_per_skb():
    assert shaping.drops_packets(shaping.plan(Link(loss=0.01), False, "f"))
    assert shaping.drops_packets(shaping.plan(Link(loss=0.01), True, "f"))
    assert not shaping.drops_packets(shaping.plan(Link(delay_ms=1), True, "f"))
    assert not shaping.drops_packets(shaping.plan(Link(), False, "f"))


def test_a_buffer_in_packets_becomes_a_pfifo_leaf_of_the_default_class():
    ops = shaping.plan(Link(bandwidth="100Mbit", buffer_packets=8), False, "f")
    assert ops == [shaping.Htb(rate_bit=10**8), shaping.Queue(8, "packets")]
    queue = ops[1]
    assert (queue.kind, queue.parent, queue.handle) == ("pfifo", shaping.DEFAULT_CLASS,
                                                        0x100000)
    assert shaping.describe(ops) == "htb 100 Mbit/s, pfifo buffer 8 packets per class"


def test_a_buffer_in_bytes_becomes_a_bfifo_leaf():
    ops = shaping.plan(Link(buffer_bytes=85_000), False, "f")
    assert ops[1] == shaping.Queue(85_000, "bytes") and ops[1].kind == "bfifo"
    assert shaping.describe(ops).endswith("bfifo buffer 85000 bytes per class")


def test_without_a_buffer_the_kernels_default_queue_stays():
    assert shaping.buffer(Link()) is None
    assert not any(isinstance(op, shaping.Queue)
                   for op in shaping.plan(Link(loss=0.1), False, "f"))
    assert shaping.plan(Link(loss=0.1), True, "f")[1].limit_packets == 1000


def test_a_buffer_on_a_lossy_link_without_netem_sits_behind_the_dropper():
    ops = shaping.plan(Link(loss=0.05, buffer_packets=16), False, "f")
    assert ops == [shaping.Htb(10**9), shaping.Drop(0.05), shaping.Queue(16, "packets")]


def test_with_netem_the_buffer_is_netems_child_and_netem_no_longer_limits():
    # The plan; tests/uml/inside/check_netem.py applies it in a kernel with netem and
    # reads it back through tc.
    ops = shaping.plan(Link(delay_ms=5, buffer_packets=8), has_netem=True, field="f")
    htb, netem, queue = ops
    assert netem == shaping.Netem(delay_ms=5, jitter_ms=0, loss=0,
                                  limit_packets=shaping.DELAY_LINE_PACKETS)
    assert queue == shaping.Queue(8, "packets", parent=shaping.NETEM_CLASS,
                                  handle=shaping.NETEM_CHILD_HANDLE)
    assert shaping.NETEM_CLASS >> 16 == shaping.NETEM_HANDLE >> 16   # netem's own class
    assert "limit 1000000" in shaping.describe(ops)
    assert shaping.describe(ops).endswith("pfifo buffer 8 packets per class")


def test_a_buffer_asks_senders_for_one_wire_packet_per_skb():
    # A 64 kB GSO skb would count as one packet of the buffer.
    assert shaping.drops_packets(shaping.plan(Link(buffer_packets=8), False, "f"))
    assert shaping.drops_packets(shaping.plan(Link(buffer_bytes=20_000), False, "f"))


def test_htb_of_a_jumbo_link_fits_a_gso_packet_and_a_frame_of_its_mtu():
    htb = shaping.plan(Link(bandwidth="1Mbit"), False, "f", mtu=9000)[0]
    assert htb == shaping.Htb(rate_bit=10**6, frame_bytes=9014)
    assert htb.burst_bytes == shaping.GSO_BYTES + 9014
    # A tenth of a second at 1 Mbit/s is 12500 bytes; at 100 kbit/s less than a frame.
    assert shaping.Htb(10**5, frame_bytes=9014).quantum_bytes == 9014
    assert shaping.Htb(10**5).quantum_bytes == shaping.MTU_BYTES


def test_priority_classes_of_a_jumbo_link_hold_a_frame_of_its_mtu():
    classes = shaping.plan_priorities(10**9, 3, mtu=9000)
    assert all(c.burst_bytes == 9014 and c.quantum_bytes >= 9014 for c in classes)
    assert all(c.cburst_bytes == shaping.GSO_BYTES + 9014 for c in classes)


def test_a_pods_own_direction_loses_at_its_wire_end_not_at_the_pods_interface():
    link = Link(loss=0.02, delay_ms=3, buffer_bytes=85_000)
    own = shaping.host_end(link)
    assert (own.loss, own.buffer_bytes, own.delay_ms) == (0.0, None, 3)
    assert not shaping.drops_packets(shaping.plan(own, has_netem=True, field="f"))
    assert shaping.wire_end(link) == [shaping.Drop(loss=0.02)]
    assert shaping.wire_end(Link()) == []
