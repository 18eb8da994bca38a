"""tailcut.net never imports tailcut.datapath (the layers in pyproject.toml): the eBPF
dropper of a link's random loss is given to the network builder by its caller (the
local runtime, the node agent), and a lossy link without one is refused before
anything is built. No root needed: nothing here reaches the kernel."""

import pytest

from tailcut import spec
from tailcut.errors import NetError
from tailcut.net import build, netns, shaping, tc, topology
from tailcut.spec.model import Link


class FakeDroppers:
    """A tc.Droppers that records what it was asked to attach."""

    def __init__(self):
        self.calls = []

    def attach(self, netns_name, ifname, loss):
        self.calls.append(("attach", netns_name, ifname, loss))
        return f"dropper {len(self.calls)}"

    def attach_in_batch(self, batch, netns_name, ifname, index, loss, direction):
        self.calls.append(("batch", netns_name, ifname, index, loss, direction))
        return f"dropper {len(self.calls)}"


def lossy_job(name):
    return spec.load_text(f"kind: TrainingJob\nmetadata: {{name: {name}}}\n"
                          "spec: {replicas: {workers: 1}, network: {uplink: {loss: 0.02}}}\n")


def test_a_lossy_network_without_droppers_is_refused_before_anything_is_built():
    topo = topology.plan(lossy_job("nodropper"))
    with pytest.raises(NetError, match=r"loss needs the eBPF dropper.*tailcut.datapath"):
        build.build(topo, has_netem=False)
    with pytest.raises(NetError, match=r"loss needs the eBPF dropper"):
        build.build_fabric(topo, topo.racks, has_netem=False)
    assert not any(netns.exists(n) for n in topo.namespaces())


def test_the_given_droppers_attach_every_drop_op_and_none_is_refused():
    ops = shaping.plan(Link(bandwidth="1Gbit", loss=0.05), False, "f")
    fake = FakeDroppers()
    assert tc.attach_droppers(ops, "ns", "eth0", fake) == ["dropper 1"]
    assert fake.calls == [("attach", "ns", "eth0", 0.05)]
    assert tc.add_dropper_requests(object(), ops, "ns", "p1", 7, fake, "ingress") == \
        ["dropper 2"]
    assert fake.calls[-1][-1] == "ingress"
    with pytest.raises(NetError, match="ns/eth0: loss 0.05 needs the eBPF dropper"):
        tc.attach_droppers(ops, "ns", "eth0", None)
    # a link that loses nothing needs none
    assert tc.attach_droppers(shaping.plan(Link(bandwidth="1Gbit"), False, "f"),
                              "ns", "eth0", None) == []


def test_the_dropper_module_is_a_droppers():
    from tailcut.datapath import dropper
    for name in ("attach", "attach_in_batch"):
        assert callable(getattr(dropper, name))
