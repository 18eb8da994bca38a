"""The per-layer exchange over a real job network, fair and with priority classes."""

import os

import pytest

from tailcut import spec
from tailcut.net import build, topology
from tailcut.scheduling import enforce, exchange

pytestmark = [pytest.mark.netns, pytest.mark.bpf]


def test_levels_follow_layer_order_in_equal_buckets():
    assert [exchange.level_of(k, 8, 4) for k in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [exchange.level_of(k, 2, 4) for k in range(2)] == [0, 2]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_tagged_exchange_delivers_the_first_layer_first_even_when_sent_last():
    job = spec.from_dict({
        "apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": f"cf-exch-{os.getpid()}"},
        "spec": {"replicas": {"workers": 1},
                 "network": {"accessLink": {"bandwidth": "50Mbit"}},
                 "scheduling": {"policy": "cadentflow", "priorityLevels": 2}}})
    topo = topology.plan(job)
    network = build.build(topo, has_netem=False)
    layers = [exchange.LayerLoad(f"l{k}", 1_000_000, 0.0, 0.0) for k in range(2)]
    try:
        # The PS starts layer 1 first (40 ms ahead): only the classes can put layer 0 first.
        fair = exchange.run(topo, layers, 1, tagged=False, levels=2,
                            reverse_stagger_s=0.04)[0]
        handle = enforce.apply(topo, job.spec.scheduling)
        try:
            tagged = exchange.run(topo, layers, 1, tagged=True, levels=2,
                                  port=exchange.PORT + 1, reverse_stagger_s=0.04)[0]
            all_counts = handle.counts()
            counts = all_counts[f"{topo.pod('ps-0').netns}/eth0"]
        finally:
            handle.detach()
    finally:
        network.destroy()
    # 1 MB takes 160 ms alone at 50 Mbit/s. Tagged, layer 0 overtakes layer 1 as soon
    # as it starts; untagged, it shares the link with (or queues behind) layer 1, which
    # has 750 kB left after its 40 ms head start: about 280 ms.
    def took(it):
        return it.pull_done_s[(0, 0)] - it.pull_start_s[(0, 0)]
    assert took(tagged) < 0.215 < took(fair), (took(tagged), took(fair))
    assert counts[0][0] > 0 and counts[1][0] > 0
    # The rack's port towards the worker saw the same tags (DSCP survives the bridge).
    rack_port = all_counts[f"{topo.racks[0].netns}/p{topo.pod('worker-0').slot}"]
    assert rack_port[0][0] > 0 and rack_port[1][0] > 0
    # Pods, rack ports and both ends of the uplink: 2 pods x 2 + 2.
    assert len(all_counts) == 6
