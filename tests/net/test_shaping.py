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


def test_htb_burst_holds_a_gso_packet_and_quantum_stays_below_the_kernel_warning():
    slow, fast = shaping.Htb(rate_bit=10**6), shaping.Htb(rate_bit=10**10)
    assert slow.burst_bytes >= shaping.GSO_BYTES
    assert fast.burst_bytes == 10**10 // 8 // 1000
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
